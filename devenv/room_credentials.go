package devenv

import "agentmesh.dev/mesh/shared/rooms"

// roomCredentials is the rooms worker's Credentials on this mesh: room
// credentials minted with the mesh's own trust chain and revoked through
// the account JWT this process pushes (Mesh.Revoke), so an expel or leave
// closes the member's room connection at once, on one server or a
// cluster.
func (m *Mesh) roomCredentials() rooms.Credentials {
	return &rooms.TrustCredentials{Trust: m.trust, Revoker: m}
}
