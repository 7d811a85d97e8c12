// Package state is the adapter's state directory (spec §4.2): who the agent
// is, how it reaches the mesh, and the node discovery directory. Everything
// secret is written 0600 in a 0700 directory, atomically, so a crash never
// leaves half an identity and nothing readable by others.
//
// Layout of <dir> (--state-dir, MESH_ADAPTER_HOME, default ~/.mesh/adapter):
//
//	identity.json   the agent: id, name, handle, and the seeds of the agent,
//	                node and owner keys (0600)
//	config.json     control and registrar URLs, the bus endpoints and the
//	                current credential (0600)
//	inbox.db        the local message queue (package inbox)
//	journal.log     requests already answered (the runtime's FileJournal)
//	allowance.json  the owner-signed allowance policy
//	guard.json      whether the agent's inbox is guarded (mesh-adapter guard)
//	skus.json       what the agent sells: the manifest's skus (start --skus)
//	pins.json       registrar keys and handle → agent pins (adapter/registrar.Pins)
//	control.sock    the running adapter's control socket (0600)
//
// Beside it, <dir>/../nodes is the node discovery directory (Nodes).
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"agentmesh.dev/mesh/shared/keys"
)

// File names inside the state directory.
const (
	IdentityFile  = "identity.json"
	ConfigFile    = "config.json"
	InboxFile     = "inbox.db"
	JournalFile   = "journal.log"
	AllowanceFile = "allowance.json"
	SocketFile    = "control.sock"
	GuardFile     = "guard.json"
	NodesDir      = "nodes"
)

// ErrNoIdentity is returned by Identity when the agent has no identity yet
// (neither `up` nor `start` has run).
var ErrNoIdentity = errors.New("this adapter has no agent identity yet: run `mesh-adapter up <agent-key>` or `mesh-adapter start --inbox --name <name>`")

// Dir is an opened state directory.
type Dir struct {
	Path string
}

// Open makes sure the directory exists with mode 0700 and refuses one that
// others can read: it holds seeds.
func Open(path string) (*Dir, error) {
	if path == "" {
		return nil, errors.New("state directory: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", path, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", abs, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", abs, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("state directory %s is not a directory", abs)
	}
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return nil, fmt.Errorf("state directory %s has mode %04o; it holds keys and must be private (chmod 700 %s)", abs, perm, abs)
	}
	return &Dir{Path: abs}, nil
}

// File is the path of name inside the directory.
func (d *Dir) File(name string) string { return filepath.Join(d.Path, name) }

// Identity is identity.json.
type Identity struct {
	AgentID string `json:"agent_id"`
	Name    string `json:"name"`
	Handle  string `json:"handle,omitempty"`
	// Guest marks an identity leased with a guest credential: it lasts as
	// long as the lease, and `start` leases a new one next time.
	Guest     bool   `json:"guest,omitempty"`
	AgentSeed string `json:"agent_seed"`
	NodeSeed  string `json:"node_seed"`
	OwnerSeed string `json:"owner_seed"`
}

// Keys are an identity's keys.
type Keys struct {
	Agent *keys.Agent
	Node  *keys.Node
	// Owner signs what the person operating the adapter decides: the
	// allowance policy and the contacts roster.
	Owner *keys.Agent
}

// NewIdentity generates the node and owner keys around agent (a fresh key
// when nil).
func NewIdentity(name string, agent *keys.Agent) (Identity, error) {
	var err error
	if agent == nil {
		if agent, err = keys.Generate[keys.AgentRole](); err != nil {
			return Identity{}, err
		}
	}
	node, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		return Identity{}, err
	}
	owner, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		return Identity{}, err
	}
	return Identity{AgentID: agent.Public(), Name: name, AgentSeed: string(agent.Seed()),
		NodeSeed: string(node.Seed()), OwnerSeed: string(owner.Seed())}, nil
}

// Keys decodes the identity's seeds, checking the agent id.
func (id Identity) Keys() (Keys, error) {
	agent, err := keys.FromSeed[keys.AgentRole]([]byte(id.AgentSeed))
	if err != nil {
		return Keys{}, fmt.Errorf("identity: agent seed: %w", err)
	}
	if agent.Public() != id.AgentID {
		return Keys{}, fmt.Errorf("identity: the agent seed is not agent %s's", id.AgentID)
	}
	node, err := keys.FromSeed[keys.NodeRole]([]byte(id.NodeSeed))
	if err != nil {
		return Keys{}, fmt.Errorf("identity: node seed: %w", err)
	}
	owner, err := keys.FromSeed[keys.AgentRole]([]byte(id.OwnerSeed))
	if err != nil {
		return Keys{}, fmt.Errorf("identity: owner seed: %w", err)
	}
	return Keys{Agent: agent, Node: node, Owner: owner}, nil
}

// Identity reads identity.json (ErrNoIdentity when absent).
func (d *Dir) Identity() (Identity, error) {
	var id Identity
	err := d.readSecret(IdentityFile, &id)
	if errors.Is(err, os.ErrNotExist) {
		return Identity{}, ErrNoIdentity
	}
	return id, err
}

// SaveIdentity writes identity.json.
func (d *Dir) SaveIdentity(id Identity) error { return d.writeSecret(IdentityFile, id) }

// Credential is how the adapter connects: a user JWT and, for a bootstrap
// or guest credential, the seed of the key that signs the broker's nonce
// (a node credential is signed by the node key).
type Credential struct {
	// Kind is "bootstrap", "node" or "guest".
	Kind      string `json:"kind"`
	JWT       string `json:"jwt"`
	Seed      string `json:"seed,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
}

// Config is config.json.
type Config struct {
	ControlURL   string      `json:"control_url,omitempty"`
	RegistrarURL string      `json:"registrar_url,omitempty"`
	NATSURLs     []string    `json:"nats_urls,omitempty"`
	Credential   *Credential `json:"credential,omitempty"`
	// ServicesKey is the key the mesh's bus services sign with, as the
	// control plane's /v1/capabilities named it when first asked: the node
	// refuses answers (admission, the registry, task records) signed by
	// any other.
	ServicesKey string `json:"services_key,omitempty"`
}

// Config reads config.json; a missing file is an empty Config.
func (d *Dir) Config() (Config, error) {
	var c Config
	err := d.readSecret(ConfigFile, &c)
	if errors.Is(err, os.ErrNotExist) {
		return Config{}, nil
	}
	return c, err
}

// SaveConfig writes config.json.
func (d *Dir) SaveConfig(c Config) error { return d.writeSecret(ConfigFile, c) }

// Guard is guard.json: whether the agent asked the admission service to
// guard its inbox (mesh-adapter guard), so that a restarted adapter serves
// the guarded inbox again and asks for the guard once more.
type Guard struct {
	Guarded bool `json:"guarded"`
	// OwnerKey signed the roster last submitted, Contacts is how many it
	// allowed by name ("" and 0 when the service kept the roster it had).
	OwnerKey  string `json:"owner_key,omitempty"`
	Contacts  int    `json:"contacts"`
	UpdatedAt string `json:"updated_at"`
}

// Guard reads guard.json; a directory without one is unguarded.
func (d *Dir) Guard() (Guard, error) {
	var g Guard
	err := d.readSecret(GuardFile, &g)
	if errors.Is(err, os.ErrNotExist) {
		return Guard{}, nil
	}
	return g, err
}

// SaveGuard writes guard.json.
func (d *Dir) SaveGuard(g Guard) error { return d.writeSecret(GuardFile, g) }

func (d *Dir) readSecret(name string, dst any) error {
	path := d.File(name)
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return fmt.Errorf("%s has mode %04o; it holds secrets and must be readable by its owner only (chmod 600 %s)", path, perm, path)
	}
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return fmt.Errorf("%s is damaged: %w", path, err)
	}
	return nil
}

func (d *Dir) writeSecret(name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	defer clear(b)
	return keys.WriteSecretFile(d.File(name), append(b, '\n'))
}
