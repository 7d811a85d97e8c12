// Package peer03 is the interoperability suite for protocol 0.3 peers
// (issue 11, upstream-notes §15): its tests play an upstream 0.3 client from
// the wire up — over the mesh's WebSocket, with envelopes it builds and signs
// itself — against this project's runtime (adapter/node) and the
// mesh-adapter binary, in both roles, on a real in-process mesh. See
// docs/protocol.md "0.2 and 0.3 peers".
//
//	go test ./conformance/peer03
package peer03
