package rooms

import (
	"context"
	"encoding/json"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	srooms "agentmesh.dev/mesh/shared/rooms"
)

// Dossier is a room's signed dossier (spec §4.2, upstream-notes §7), as
// the rooms service signed it: Raw is the exact JSON, which is what is
// written to a file and verified.
type Dossier struct {
	RoomID string          `json:"room_id"`
	Raw    json.RawMessage `json:"dossier"`
	// Summary is what the verified manifest says.
	Summary DossierSummary `json:"summary"`
}

// DossierSummary is what a verified dossier's manifest says.
type DossierSummary struct {
	Format    string `json:"format"`
	RoomID    string `json:"room_id"`
	RoomName  string `json:"room_name,omitempty"`
	Creator   string `json:"creator"`
	Entries   int    `json:"entries"`
	Files     int    `json:"files"`
	SignerPub string `json:"signer_pub"`
}

// Dossier asks the rooms service for the room's dossier (any member may)
// and verifies it before handing it back.
func (c *Client) Dossier(ctx context.Context, ref string) (Dossier, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return Dossier{}, err
	}
	if err := durable(r, "record or dossier"); err != nil {
		return Dossier{}, err
	}
	var raw json.RawMessage
	if err := c.roomCall(ctx, protocol.RoomVerbSubject("dossier"), r, nil, &raw); err != nil {
		return Dossier{}, err
	}
	sum, err := VerifyDossier(raw)
	if err != nil {
		return Dossier{}, err
	}
	if sum.RoomID != r.RoomID {
		return Dossier{}, errs.Newf(errs.IdentityMismatch, "the rooms service answered with the dossier of room %s, not %s", sum.RoomID, r.RoomID)
	}
	if pin := c.cfg.ServicesKey; pin != "" && sum.SignerPub != pin {
		return Dossier{}, errs.Newf(errs.IdentityMismatch, "the dossier is signed by %s, not the mesh's services key", sum.SignerPub)
	}
	return Dossier{RoomID: r.RoomID, Raw: raw, Summary: sum}, nil
}

// VerifyDossier checks a dossier offline (shared/rooms.VerifyDossier: the
// manifest's signature by its signer_pub, the counts, the SHA-256 of the
// record and of the files, each carried file's bytes against its digest)
// and returns what its manifest says. Whose key signer_pub is, is the
// caller's to judge: the mesh's services key (Config.ServicesKey).
func VerifyDossier(raw []byte) (DossierSummary, error) {
	if err := srooms.VerifyDossier(raw); err != nil {
		return DossierSummary{}, errs.Wrap(errs.IdentityMismatch, err.Error(), err)
	}
	var d struct {
		Manifest DossierSummary `json:"manifest"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return DossierSummary{}, errs.Wrap(errs.InputInvalid, "the dossier is not readable", err)
	}
	return d.Manifest, nil
}
