package registrar

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
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
type Pins struct {
	path string
	mu   sync.Mutex
}

// OpenPins uses the pins file at path (it need not exist yet).
func OpenPins(path string) *Pins { return &Pins{path: path} }

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
	p.mu.Lock()
	defer p.mu.Unlock()
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
	p.mu.Lock()
	defer p.mu.Unlock()
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
