package registrar

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// PinsFile is the pins' file name in the adapter's state directory.
const PinsFile = "pins.json"

// Pins is what a resolver remembers per registrar (upstream-notes §12.4:
// resolvers pin `handle → agent key` and the registrar's signing key, and
// never re-pin silently): the registrar key it first verified a card with,
// and the agent each handle was bound to when first resolved. The file is
// JSON, mode 0600, replaced atomically on every change:
//
//	{"registrars": {"<registrar URL>": {"key": "U…", "kid": "…", "pinned_at": "…",
//	    "handles": {"<case-folded handle>": {"handle": "…", "agent_id": "U…", "pinned_at": "…"}}}}}
//
// Every change is load → modify → write under two locks, so that
// concurrent sends never lose each other's pins (a lost pin would quietly
// re-enable trust on first use for that handle): a mutex shared by every
// Pins of the same file in this process (the running adapter opens one per
// send), and an advisory lock (flock) on pins.json.lock beside the file,
// against other processes (a one-shot send beside the running adapter).
type Pins struct {
	path string
	mu   *sync.Mutex
}

// pathLocks holds one mutex per pins file (by absolute, cleaned path) for
// the whole process.
var pathLocks sync.Map // string → *sync.Mutex

// OpenPins uses the pins file at path (it need not exist yet). Every Pins
// of the same file in one process shares one lock.
func OpenPins(path string) *Pins {
	key := filepath.Clean(path)
	if abs, err := filepath.Abs(path); err == nil {
		key = abs
	}
	mu, _ := pathLocks.LoadOrStore(key, new(sync.Mutex))
	return &Pins{path: path, mu: mu.(*sync.Mutex)}
}

// LockSuffix names the lock file beside the pins file (pins.json.lock). It
// is created once and left in place: removing it would let two processes
// lock two different files.
const LockSuffix = ".lock"

// lock takes the process-wide mutex of the file, then the file lock held
// against other processes; unlock releases both.
func (p *Pins) lock() (unlock func(), err error) {
	p.mu.Lock()
	if err := os.MkdirAll(filepath.Dir(p.path), 0o700); err != nil {
		p.mu.Unlock()
		return nil, fmt.Errorf("pins: %w", err)
	}
	release, err := lockFile(p.path + LockSuffix)
	if err != nil {
		p.mu.Unlock()
		return nil, fmt.Errorf("pins: lock %s: %w", p.path+LockSuffix, err)
	}
	return func() { release(); p.mu.Unlock() }, nil
}

// Path is the pins file.
func (p *Pins) Path() string { return p.path }

type pinFile struct {
	Registrars map[string]*registrarPin `json:"registrars"`
}

type registrarPin struct {
	Key      string               `json:"key"`
	Kid      string               `json:"kid"`
	PinnedAt string               `json:"pinned_at"`
	Handles  map[string]handlePin `json:"handles"`
}

type handlePin struct {
	Handle   string `json:"handle"`
	AgentID  string `json:"agent_id"`
	PinnedAt string `json:"pinned_at"`
}

func (p *Pins) load() (pinFile, error) {
	f := pinFile{Registrars: map[string]*registrarPin{}}
	b, err := os.ReadFile(p.path)
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("pins: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("the pins file %s is damaged (%v); it protects you from a handle silently moving to another agent, so fix or remove it knowingly", p.path, err)
	}
	if f.Registrars == nil {
		f.Registrars = map[string]*registrarPin{}
	}
	return f, nil
}

// RegistrarKey is the key pinned for the registrar at base, or "".
func (p *Pins) RegistrarKey(base string) (string, error) {
	// The file is only ever replaced whole (a rename), so a read needs no
	// lock to see a consistent file.
	f, err := p.load()
	if err != nil {
		return "", err
	}
	if r := f.Registrars[normalizeBase(base)]; r != nil {
		return r.Key, nil
	}
	return "", nil
}

// Pin records that the registrar at base, signing with key, binds handle to
// agent. A registrar key other than the pinned one is refused
// (ErrRegistrarKeyChanged). A handle pinned to another agent is a
// *BindingChangedError, unless accept: then the new agent is pinned and
// the previous one returned.
func (p *Pins) Pin(base, key, handle, agent string, accept bool, now time.Time) (previous string, err error) {
	unlock, err := p.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	f, err := p.load()
	if err != nil {
		return "", err
	}
	b := normalizeBase(base)
	at := protocol.FormatTime(now)
	r := f.Registrars[b]
	switch {
	case r == nil:
		r = &registrarPin{Key: key, Kid: Kid(key), PinnedAt: at, Handles: map[string]handlePin{}}
		f.Registrars[b] = r
	case r.Key != key:
		return "", fmt.Errorf("%w: %s is pinned to %s, not %s", ErrRegistrarKeyChanged, base, r.Key, key)
	}
	if r.Handles == nil {
		r.Handles = map[string]handlePin{}
	}
	h, known := r.Handles[fold(handle)]
	switch {
	case known && h.AgentID == agent:
		return "", nil
	case known && !accept:
		return "", &BindingChangedError{Registrar: base, Handle: handle, Pinned: h.AgentID, PinnedAt: h.PinnedAt, Now: agent}
	case known:
		previous = h.AgentID
	}
	r.Handles[fold(handle)] = handlePin{Handle: handle, AgentID: agent, PinnedAt: at}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return "", err
	}
	if err := keys.WriteSecretFile(p.path, append(data, '\n')); err != nil {
		return "", fmt.Errorf("pins: %w", err)
	}
	return previous, nil
}

// BindingChangedError is a handle whose agent is not the one pinned for it:
// the handle was re-paired with another agent, or someone impersonates it.
// Nothing is sent to the new agent until the user accepts the change.
type BindingChangedError struct {
	Registrar, Handle string
	Pinned, PinnedAt  string
	Now               string
}

func (e *BindingChangedError) Error() string {
	return fmt.Sprintf("WARNING: the handle %s is now bound to a DIFFERENT agent (%s; pinned since %s: %s). Nothing was sent. "+
		"If its owner re-paired it on purpose, send again with --accept-new-binding; otherwise someone may be impersonating it",
		e.Handle, e.Now, e.PinnedAt, e.Pinned)
}

// Warning is the loud banner a person should see.
func (e *BindingChangedError) Warning() string {
	bar := strings.Repeat("@", 66)
	return fmt.Sprintf(`%[1]s
@  WARNING: THE AGENT BEHIND A HANDLE HAS CHANGED!                @
%[1]s
The registrar %[2]s now binds
  %[3]s
to agent %[4]s,
but this adapter pinned it to agent %[5]s (since %[6]s).
Its owner may have re-paired it with a new agent, or someone may be
impersonating it. Nothing was sent. To accept the new agent, send again
with --accept-new-binding.
`, bar, e.Registrar, e.Handle, e.Now, e.Pinned, e.PinnedAt)
}
