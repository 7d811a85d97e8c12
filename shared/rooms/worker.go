package rooms

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
)

// Name is the worker's name (micro service mesh-rooms, queue group
// bus.QueueGroup(Name)).
const Name = "rooms"

// Streams of the rooms (DESIGN §11 "Rooms"): the record of every durable
// room in one stream, a subject per room; the drive's files in another, one
// message per file.
const (
	RecordStream = "MESH_ROOMS"
	DriveStream  = "MESH_DRIVE"
)

// RecordSubject is where a room's recorded messages are appended.
func RecordSubject(roomID string) string { return "mesh.internal.rooms.rec." + roomID }

// DriveSubject is where one drive file's bytes are kept.
func DriveSubject(roomID, digestHex string) string {
	return "mesh.internal.drive." + roomID + "." + digestHex
}

// Limits of the rooms (upstream-notes §7, §13; H§7). The zero value of a
// member takes its default.
type Limits struct {
	RoomsPerOperator      int           // durable rooms per operator: 10
	RecordMsgs            int64         // messages in one room's record: 10,000
	RecordBytes           int64         // bytes in one room's record: 8 MB
	FileBytes             int64         // one drive file: 512 KB
	DriveBytesPerOperator int64         // every drive file of an operator's rooms: 100 MB
	IdleAfter             time.Duration // a room with no traffic this long expires: 3 days
	CredentialTTL         time.Duration // an acl room credential: 1 hour
	Roster                int           // acl members of one room: 1,000
	DriveFiles            int           // entries (files and links) on one room's drive: 1,000
}

// Default limits.
const (
	DefaultRoomsPerOperator      = 10
	DefaultRecordMsgs            = 10_000
	DefaultRecordBytes           = 8 << 20
	DefaultFileBytes             = 512 << 10
	DefaultDriveBytesPerOperator = 100 << 20
	DefaultIdleAfter             = 72 * time.Hour
	DefaultCredentialTTL         = time.Hour
	DefaultRoster                = 1000
	DefaultDriveFiles            = 1000
)

// DefaultLimits are the limits of the reference deployment.
var DefaultLimits = Limits{RoomsPerOperator: DefaultRoomsPerOperator, RecordMsgs: DefaultRecordMsgs,
	RecordBytes: DefaultRecordBytes, FileBytes: DefaultFileBytes, DriveBytesPerOperator: DefaultDriveBytesPerOperator,
	IdleAfter: DefaultIdleAfter, CredentialTTL: DefaultCredentialTTL, Roster: DefaultRoster, DriveFiles: DefaultDriveFiles}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.RoomsPerOperator > 0 {
		d.RoomsPerOperator = l.RoomsPerOperator
	}
	if l.RecordMsgs > 0 {
		d.RecordMsgs = l.RecordMsgs
	}
	if l.RecordBytes > 0 {
		d.RecordBytes = l.RecordBytes
	}
	if l.FileBytes > 0 {
		d.FileBytes = l.FileBytes
	}
	if l.DriveBytesPerOperator > 0 {
		d.DriveBytesPerOperator = l.DriveBytesPerOperator
	}
	if l.IdleAfter > 0 {
		d.IdleAfter = l.IdleAfter
	}
	if l.CredentialTTL > 0 {
		d.CredentialTTL = l.CredentialTTL
	}
	if l.Roster > 0 {
		d.Roster = l.Roster
	}
	if l.DriveFiles > 0 {
		d.DriveFiles = l.DriveFiles
	}
	return d
}

// Owner is what the registrar says about a room's creator: the handle its
// key is bound to and the operator (account.OperatorID of the handle's
// address, the card's operator.id), whose
// quota the room counts against.
type Owner struct {
	Handle   string
	Operator string
}

// Owners resolves an agent key to its handle (spec §4.3: the creator must
// reverse-resolve to an email-verified handle). An agent bound to no handle
// is errs.NotNamed.
type Owners interface {
	Owner(ctx context.Context, agentID string) (Owner, error)
}

// RoomCredential is a minted acl room credential: a user JWT for a fresh
// key, scoped to one room's traffic (creds.RoomPermissions).
type RoomCredential struct {
	JWT     string
	Seed    string // the fresh key's seed; goes only to the member, on a private reply
	UserKey string // the fresh key's public half, which revocation names
	Expires time.Time
}

// Credentials mints and revokes acl room credentials. The rooms worker
// holds no trust material of its own; the composition root gives it this.
type Credentials interface {
	MintRoom(roomID, member string, ttl time.Duration) (RoomCredential, error)
	// Revoke revokes every JWT issued to the user keys up to at, at the
	// broker: their live connections close.
	Revoke(ctx context.Context, userKeys []string, at time.Time) error
}

// Config configures the rooms worker.
type Config struct {
	// Replicas of the bucket and streams (bus.Replicas: 0 is 1).
	Replicas int
	Limits   Limits
	// Owners resolves creators to handles; nil refuses every provision
	// with UNAVAILABLE.
	Owners Owners
	// Credentials mints and revokes acl room credentials; nil refuses
	// mesh.rooms.credential with UNAVAILABLE.
	Credentials Credentials
	// RevocationSync is how often each copy brings the broker's
	// revocations of room credentials in line with the cred records
	// (syncRevocations): 0 is DefaultRevocationSync, negative never.
	RevocationSync time.Duration
}

// Worker is one running copy of the rooms worker.
type Worker struct {
	svc    *bus.Service
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	cfg    Config
	limits Limits
	now    func() time.Time

	stopOnce sync.Once
	stopErr  error
	stops    []func() error

	// core is the state of the record's ingest (core.go).
	core coreState
	// gate is Access, recording the holders of capability and sealed
	// rooms, which the ingest asks about (holders.go).
	gate *Gate
}

// endpoint is one verb the worker serves.
type endpoint struct {
	name, subject string
	h             bus.Handler
}

// Start runs one copy of the rooms worker in env.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "durable rooms: record, drive, notes, acl grade")
	if err != nil {
		return nil, err
	}
	w := &Worker{svc: svc, js: svc.JS, cfg: cfg, limits: cfg.Limits.withDefaults(), now: svc.Now}
	fail := func(err error) (*Worker, error) {
		_ = w.Stop()
		return nil, err
	}
	w.kv, err = bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: Bucket,
		Description: "durable rooms: rooms, members, cursors, notes, drive index, room credentials, quotas, board items",
		Replicas:    bus.Replicas(cfg.Replicas)})
	if err != nil {
		return fail(err)
	}
	w.gate = NewGate(w.kv, svc.NC, w.now)
	if err := w.bindStreams(ctx); err != nil {
		return fail(err)
	}
	var eps []endpoint
	eps = append(eps, w.coreEndpoints()...)
	eps = append(eps, w.aclEndpoints()...)
	eps = append(eps, w.driveEndpoints()...)
	for _, ep := range eps {
		if err := svc.Endpoint(ep.name, ep.subject, ep.h); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, ep.subject, err))
		}
	}
	if err := w.startIngest(ctx); err != nil {
		return fail(err)
	}
	w.startRevocationSync()
	if err := env.NC.Flush(); err != nil {
		return fail(fmt.Errorf("%s: flush: %w", Name, err))
	}
	return w, nil
}

// Stop ends the copy; safe to call more than once.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() {
		var all []error
		for i := len(w.stops) - 1; i >= 0; i-- {
			all = append(all, w.stops[i]())
		}
		all = append(all, w.svc.Stop())
		w.stopErr = errors.Join(all...)
	})
	return w.stopErr
}

// onStop registers f to run at Stop, before the service stops (last
// registered, first run).
func (w *Worker) onStop(f func() error) { w.stops = append(w.stops, f) }
