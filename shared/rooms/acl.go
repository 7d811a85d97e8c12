package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The acl grade (spec §3.6, §4.3; upstream-notes §7): the creator admits
// and expels, a member leaves, and an admitted member gets a short-lived
// room credential (creds.RoomPermissions) for the room's traffic on
// mesh.aclroom.<room>.>. Expel and leave revoke the member's live room
// credentials at the broker at once (their connections close), and
// renewal is refused from then on: that is the revocation the grade is.
//
// Membership decisions read the room through its stream's leader
// (bus.LeaderGet): on a replicated bucket a plain read may be answered by
// a follower that has not applied the latest expel yet.

// Expel severities (upstream-notes §7); anything else is conduct.
const (
	SeverityTimeout = "timeout"
	SeverityConduct = "conduct"
	SeveritySafety  = "safety"
)

// MaxLiveCredentials is how many unexpired room credentials one member
// may hold for one room at once. A member renewing before expiry holds
// two; the bound keeps the record revocation reads small.
const MaxLiveCredentials = 8

// aclEndpoints are the acl grade's verbs: admit, expel, leave, credential.
func (w *Worker) aclEndpoints() []endpoint {
	return []endpoint{
		{"admit", protocol.RoomVerbSubject("admit"), w.admit},
		{"expel", protocol.RoomVerbSubject("expel"), w.expel},
		{"leave", protocol.RoomVerbSubject("leave"), w.leave},
		{"credential", protocol.RoomVerbSubject("credential"), w.credential},
	}
}

// aclMemberEntry is the value of member.<agent>.<room_id> that admit
// writes: the index mesh.rooms.mine lists an agent's acl rooms by (it
// reads the key's presence and checks membership on the room itself). It
// has the shape of provision's entry for the creator.
type aclMemberEntry struct {
	Role string `json:"role"` // "member"
	At   string `json:"at"`
}

// admit adds an agent to an acl room's members: creator only.
// Payload {descriptor, agent_id}.
func (w *Worker) admit(ctx context.Context, r *bus.Request) (any, error) {
	var req struct {
		Descriptor json.RawMessage `json:"descriptor"`
		AgentID    string          `json:"agent_id"`
	}
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	d, room, err := w.aclRoom(ctx, req.Descriptor, "admit")
	if err != nil {
		return nil, err
	}
	if r.Env.From != room.Creator {
		return nil, errs.Newf(errs.Forbidden, "only the creator of room %s may admit members", d.RoomID)
	}
	if !keys.IsUserPublicKey(req.AgentID) {
		return nil, errs.New(errs.InputInvalid, "agent_id must be the agent's public key (U followed by 55 characters)")
	}
	roster := w.limits.Roster
	_, changed, err := bus.CAS(ctx, w.kv, RoomKey(d.RoomID), func(cur *Room, exists bool) (*Room, error) {
		switch {
		case !exists || cur.ClosedAt != nil:
			return nil, errACLRoomGone(d.RoomID)
		case cur.IsMember(req.AgentID):
			return nil, bus.ErrNoChange
		case len(cur.Members) >= roster:
			return nil, errs.Newf(errs.QuotaExceeded, "room %s has %d members, its limit; expel someone before admitting more", d.RoomID, roster)
		}
		cur.Members = append(cur.Members, req.AgentID)
		cur.Expelled = slices.DeleteFunc(cur.Expelled, func(a string) bool { return a == req.AgentID })
		return cur, nil
	})
	if err != nil {
		return nil, err
	}
	// The index follows the room: written again on a repeated admit, so a
	// write lost after the room's changed is made good by admitting again.
	if req.AgentID != room.Creator {
		b, err := json.Marshal(aclMemberEntry{Role: "member", At: protocol.FormatTime(w.now())})
		if err != nil {
			return nil, err
		}
		if _, err := w.kv.Put(ctx, MemberKey(req.AgentID, d.RoomID), b); err != nil {
			return nil, fmt.Errorf("rooms: index member %s of %s: %w", req.AgentID, d.RoomID, err)
		}
	}
	if changed {
		w.svc.Log.Info("acl member admitted", "room", d.RoomID, "member", req.AgentID)
	}
	return map[string]any{"room_id": d.RoomID, "member": req.AgentID, "admitted": true}, nil
}

// expel removes a member from an acl room and revokes their live room
// credentials: creator only. Payload {descriptor, member, severity}.
func (w *Worker) expel(ctx context.Context, r *bus.Request) (any, error) {
	var req struct {
		Descriptor json.RawMessage `json:"descriptor"`
		Member     string          `json:"member"`
		Severity   string          `json:"severity"`
	}
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	d, room, err := w.aclRoom(ctx, req.Descriptor, "expel")
	if err != nil {
		return nil, err
	}
	if r.Env.From != room.Creator {
		return nil, errs.Newf(errs.Forbidden, "only the creator of room %s may expel members", d.RoomID)
	}
	switch {
	case !keys.IsUserPublicKey(req.Member):
		return nil, errs.New(errs.InputInvalid, "member must be the agent's public key (U followed by 55 characters)")
	case req.Member == room.Creator:
		return nil, errs.Newf(errs.InputInvalid, "the creator cannot be expelled from room %s; reclaim the room (mesh.rooms.reclaim) to close it", d.RoomID)
	}
	severity := normalSeverity(req.Severity)
	roster := w.limits.Roster
	_, changed, err := bus.CAS(ctx, w.kv, RoomKey(d.RoomID), func(cur *Room, exists bool) (*Room, error) {
		if !exists || cur.ClosedAt != nil {
			return nil, errACLRoomGone(d.RoomID)
		}
		was := slices.Contains(cur.Members, req.Member)
		if !was && slices.Contains(cur.Expelled, req.Member) {
			return nil, bus.ErrNoChange
		}
		cur.Members = slices.DeleteFunc(cur.Members, func(a string) bool { return a == req.Member })
		cur.Expelled = append(cur.Expelled, req.Member)
		// The expelled list only words a refusal: an agent off it is still
		// no member. So its oldest entries give way at the roster's size.
		if n := len(cur.Expelled); n > roster {
			cur.Expelled = cur.Expelled[n-roster:]
		}
		return cur, nil
	})
	if err != nil {
		return nil, err
	}
	// Always carried through, changed or not: expelling again finishes
	// what a failed revocation left undone.
	revoked, err := w.dropMember(ctx, d.RoomID, req.Member)
	if err != nil {
		return nil, err
	}
	if changed || revoked > 0 {
		w.svc.Log.Info("acl member expelled", "room", d.RoomID, "member", req.Member, "severity", severity, "credentials_revoked", revoked)
	}
	return map[string]any{"room_id": d.RoomID, "member": req.Member, "severity": severity, "expelled": true,
		"credentials_revoked": revoked}, nil
}

// normalSeverity is an expel's severity: an unknown one is conduct
// (upstream-notes §7).
func normalSeverity(s string) string {
	switch s {
	case SeverityTimeout, SeverityConduct, SeveritySafety:
		return s
	}
	return SeverityConduct
}

// leave takes the caller out of an acl room (first person). Leaving a room
// one is not in answers as leaving does; the creator is refused and
// pointed at reclaim. Payload {descriptor}.
func (w *Worker) leave(ctx context.Context, r *bus.Request) (any, error) {
	var req struct {
		Descriptor json.RawMessage `json:"descriptor"`
	}
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	d, _, err := w.aclRoom(ctx, req.Descriptor, "leave")
	if err != nil {
		return nil, err
	}
	if err := w.memberLeft(ctx, d.RoomID, r.Env.From); err != nil {
		return nil, err
	}
	return map[string]any{"room_id": d.RoomID, "member": r.Env.From, "left": true}, nil
}

// credential mints a room credential for an admitted member, on a private
// reply only: it carries the fresh key's seed. Payload {descriptor}.
// Answer {jwt, seed, inbox_prefix, expires_at}: the member connects a
// second connection with it, its inbox prefix set to inbox_prefix.
func (w *Worker) credential(ctx context.Context, r *bus.Request) (any, error) {
	var req struct {
		Descriptor json.RawMessage `json:"descriptor"`
	}
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if w.cfg.Credentials == nil {
		return nil, errs.New(errs.Unavailable, "this mesh mints no room credentials (the rooms service runs without the trust chain); acl rooms cannot be joined here")
	}
	if !r.PrivateReply() {
		return nil, errs.New(errs.Forbidden, "a room credential carries its seed and is sent only to a private reply prefix: ask from a connection whose inbox prefix is _MESH_INBOX.<your credential key>")
	}
	d, room, err := w.aclRoom(ctx, req.Descriptor, "credential")
	if err != nil {
		return nil, err
	}
	from := r.Env.From
	if err := mayHoldCredential(room, from); err != nil {
		return nil, err
	}
	rc, err := w.cfg.Credentials.MintRoom(d.RoomID, from, w.limits.CredentialTTL)
	if err != nil {
		return nil, fmt.Errorf("rooms: mint a room credential for %s in %s: %w", from, d.RoomID, err)
	}
	if err := w.recordCredential(ctx, d.RoomID, from, rc); err != nil {
		return nil, err
	}
	// An expel or leave that changed the room after the check above read
	// the credential record before this credential was in it: read the
	// room again, and take the credential back if the member is gone.
	// (Either that read sees the member gone, or the expel's read of the
	// record sees the credential and revokes it.)
	room, err = w.aclLeaderRoom(ctx, d.RoomID)
	if err == nil {
		err = mayHoldCredential(room, from)
	}
	if err != nil {
		if _, rerr := w.revokeCredentials(ctx, d.RoomID, from); rerr != nil {
			w.svc.Log.Error("a room credential minted during an expel could not be revoked", "room", d.RoomID, "member", from, "err", rerr)
		}
		return nil, err
	}
	return map[string]any{
		"room_id":      d.RoomID,
		"jwt":          rc.JWT,
		"seed":         rc.Seed,
		"inbox_prefix": protocol.ACLRoomInboxPrefix(d.RoomID),
		"expires_at":   rc.Expires.UTC().Format(time.RFC3339),
	}, nil
}

// mayHoldCredential refuses an agent a room credential unless it is a
// member of a room that is not being removed; the expelled list is read
// first, to say why. (A credential recorded after removal listed the
// room's credentials would never be revoked: the check after minting
// takes it back.)
func mayHoldCredential(room *Room, agent string) error {
	if room.ClosedAt != nil {
		return errACLRoomGone(room.ID)
	}
	if slices.Contains(room.Expelled, agent) {
		return errs.Newf(errs.Forbidden, "you were expelled from room %s; only its creator can admit you again", room.ID)
	}
	if !room.IsMember(agent) {
		return errs.Newf(errs.Forbidden, "you are not a member of room %s; ask its creator to admit you", room.ID)
	}
	return nil
}

// aclRoom reads the acl room a verb names, for verb: the descriptor
// verifies and is the one the room was provisioned with, and the stored
// room is of the acl grade and not being removed (NOT_FOUND); the room is
// read through its stream's leader. Membership is each
// verb's own check (leave answers a non-member; Access would refuse it).
func (w *Worker) aclRoom(ctx context.Context, raw json.RawMessage, verb string) (*Descriptor, *Room, error) {
	d, err := ParseDescriptor(raw)
	if err != nil {
		return nil, nil, err
	}
	room, err := w.aclLeaderRoom(ctx, d.RoomID)
	if err != nil {
		return nil, nil, err
	}
	if !sameDescriptor(room.Descriptor, d.Raw) {
		return nil, nil, errs.Newf(errs.IdentityMismatch, "the descriptor is not the one room %s was provisioned with", d.RoomID)
	}
	// A room being removed (reclaim or expiry has revoked its
	// credentials) takes no acl verb.
	if room.ClosedAt != nil {
		return nil, nil, errACLRoomGone(room.ID)
	}
	// The grade is the stored room's, never the call's copy.
	if room.Privacy != GradeACL {
		return nil, nil, errs.Newf(errs.InputInvalid, "room %s is a %s room: %s is for acl rooms (a %s room's members are whoever holds its descriptor)",
			room.ID, room.Privacy, verb, room.Privacy)
	}
	return d, room, nil
}

// aclLeaderRoom reads room.<id> through the stream's leader (NOT_FOUND when
// it is not provisioned).
func (w *Worker) aclLeaderRoom(ctx context.Context, roomID string) (*Room, error) {
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, Bucket, RoomKey(roomID))
	if err != nil {
		return nil, fmt.Errorf("rooms: read room %s: %w", roomID, err)
	}
	if !found {
		return nil, errACLRoomGone(roomID)
	}
	var room Room
	if err := json.Unmarshal(b, &room); err != nil {
		return nil, fmt.Errorf("rooms: decode room %s: %w", roomID, err)
	}
	return &room, nil
}

// errACLRoomGone is the refusal of a call naming a room that is not (or no
// longer) provisioned.
func errACLRoomGone(roomID string) error {
	return errs.Newf(errs.NotFound, "room %s is not provisioned on this mesh (or was reclaimed or expired)", roomID)
}
