package protocol

import (
	"crypto/sha256"
	"encoding/hex"
)

// The headers of an agent's outbox copy of the answer that ends a request.
// The runtime (adapter/node) sets them; the activity worker records them in
// the audit rows of both parties (docs/audit.md "Where rows come from").
// They say what only the request carries, which the outbox copy (the
// signed answer, unchanged) does not: the offering asked for, the digest
// of the input, and how long the answer took. They are the answering
// runtime's statement, not signed: the broker lets only a credential
// hosting the agent publish on its outbox, and that is all that vouches
// for them.
const (
	// HdrAuditOffering is the offering the request asked for.
	HdrAuditOffering = "Mesh-Audit-Offering"
	// HdrAuditInput is InputSHA256 of the request.
	HdrAuditInput = "Mesh-Audit-Input-Sha256"
	// HdrAuditDuration is how long the answer took, in whole
	// milliseconds: from when the runtime took the request to when it
	// sent this answer.
	HdrAuditDuration = "Mesh-Audit-Duration-Ms"
)

// nullJSON is the input of a request without one.
var nullJSON = []byte("null")

// InputSHA256 is the audit digest of a request's input: the lowercase hex
// SHA-256 of the canonical JSON (JCS) of payload.input, as signed, or of
// "null" when the payload has no input. Either party can compute it from
// the request it sent or received; the input itself never leaves them.
func InputSHA256(e *Envelope) string {
	payload := e.Payload
	if !e.decodedPayload() {
		// A payload not made by the decoder is canonical by contract;
		// made canonical here all the same, so the digest cannot depend
		// on how it was built.
		var err error
		if payload, err = AppendCanonicalJSON(nil, e.Payload); err != nil {
			payload = nil
		}
	}
	in, ok := canonMember(payload, "input")
	if !ok {
		in = nullJSON
	}
	sum := sha256.Sum256(in)
	return hex.EncodeToString(sum[:])
}

// IsStreamChunk reports whether a respond is a frame of a task's stream
// (mesh.task.<id>.stream): its payload has a chunk_index. The final frame
// says completed, but the task's answer is its terminal update.
func IsStreamChunk(e *Envelope) bool {
	payload := e.Payload
	if !e.decodedPayload() {
		var err error
		if payload, err = AppendCanonicalJSON(nil, e.Payload); err != nil {
			return false
		}
	}
	_, ok := canonMember(payload, "chunk_index")
	return ok
}
