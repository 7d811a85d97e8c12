package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/daemon"
)

func init() {
	register(&command{name: "guard", usage: "[--roster <file>] [--json]",
		summary: "guard the agent's inbox with the signed contacts roster",
		help: `Asks the mesh's admission service to guard this agent's inbox with the
admission roster "contacts export" writes (built and signed by the owner
key now, or the one in --roster): the contacts on it reach the agent,
other registered agents are held for you, anonymous senders are blocked,
and all of them get the same "queued" receipt, so no sender can tell.
The running adapter then takes its requests from the guarded inbox, and
stays guarded across restarts until "unguard". Run it again after new
contacts, to submit a fresh roster. Needs the running adapter.

Example:
  mesh-adapter guard
  mesh-adapter contacts export --out roster.json && mesh-adapter guard --roster roster.json`,
		run: runGuard})
	register(&command{name: "unguard", usage: "[--json]",
		summary: "withdraw the guard: take requests at the public inbox again",
		help: `Withdraws the guard "guard" set: the admission service stops taking the
agent's public inbox and the running adapter takes its requests there
again. The roster stays with the service for the next "guard". Needs the
running adapter.

Example:
  mesh-adapter unguard`,
		run: runUnguard})
	register(&command{name: "status", usage: "[--json]",
		summary: "show whether the adapter runs, and whether its inbox is guarded",
		help: `Prints the agent, whether an adapter is running with this state
directory, its mode and node, whether the agent's inbox is guarded, and the
credential's expiry. Without a running adapter it says so, and shows the
guard as last recorded.

Example:
  mesh-adapter status --json`,
		run: runStatus})
}

func runGuard(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("guard", flag.ContinueOnError)
	rosterFile := fs.String("roster", "", "submit this roster (as contacts export wrote it) instead of a fresh one")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	dir, _, ks, err := e.identity()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if *rosterFile != "" {
		b, err := os.ReadFile(*rosterFile)
		if err != nil {
			return fmt.Errorf("read the roster: %w", err)
		}
		var obj map[string]any
		if err := json.Unmarshal(b, &obj); err != nil {
			return fmt.Errorf("%s is not a roster (a JSON object as contacts export writes it): %w", *rosterFile, err)
		}
		raw = b
	} else {
		r, err := signedRoster(dir, ks)
		if err != nil {
			return err
		}
		if raw, err = json.Marshal(r); err != nil {
			return err
		}
	}
	var res daemon.GuardResult
	if err := e.call(control.Request{Op: "guard", Roster: raw}, &res, 30*time.Second); err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(e.Stdout).Encode(res)
	}
	if !res.Guarded {
		return errors.New("the admission service answered that the agent is not guarded")
	}
	fmt.Fprintf(e.Stdout, "agent %s is guarded: %d contacts on the roster signed by owner key %s reach it; other registered agents are held for you, anonymous senders blocked\n",
		res.AgentID, res.Contacts, res.OwnerKey)
	return nil
}

func runUnguard(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("unguard", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	var res daemon.GuardResult
	if err := e.call(control.Request{Op: "unguard"}, &res, 30*time.Second); err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(e.Stdout).Encode(res)
	}
	fmt.Fprintf(e.Stdout, "agent %s is no longer guarded: it takes requests at its public inbox\n", res.AgentID)
	return nil
}

// Status is the answer of `status --json`.
type Status struct {
	AgentID string `json:"agent_id"`
	Name    string `json:"name"`
	Running bool   `json:"running"`
	Mode    string `json:"mode,omitempty"`
	NodeID  string `json:"node_id,omitempty"`
	Guarded bool   `json:"guarded"`
	// CredentialExpiresAt is the connection credential's expiry (empty
	// when it does not expire, or the adapter is not running).
	CredentialExpiresAt string `json:"credential_expires_at,omitempty"`
}

func runStatus(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	dir, id, _, err := e.identity()
	if err != nil {
		return err
	}
	st := Status{AgentID: id.AgentID, Name: id.Name}
	var live struct {
		Mode    string `json:"mode"`
		NodeID  string `json:"node_id"`
		Guarded bool   `json:"guarded"`
		Health  struct {
			Credential struct {
				ExpiresAt time.Time
			}
		} `json:"health"`
	}
	switch err := callDir(dir, "status", &live); {
	case err == nil:
		st.Running, st.Mode, st.NodeID, st.Guarded = true, live.Mode, live.NodeID, live.Guarded
		if exp := live.Health.Credential.ExpiresAt; !exp.IsZero() {
			st.CredentialExpiresAt = exp.UTC().Format(time.RFC3339)
		}
	case errors.Is(err, control.ErrNotRunning):
		g, err := dir.Guard()
		if err != nil {
			return err
		}
		st.Guarded = g.Guarded
	default:
		return err
	}
	if *asJSON {
		return json.NewEncoder(e.Stdout).Encode(st)
	}
	fmt.Fprintf(e.Stdout, "agent id: %s\nname:     %s\n", st.AgentID, st.Name)
	guarded := "no"
	if st.Guarded {
		guarded = "yes (the admission service takes the public inbox; see mesh-adapter guard)"
	}
	if !st.Running {
		fmt.Fprintf(e.Stdout, "running:  no\nguarded:  %s, as last recorded\n", guarded)
		return nil
	}
	fmt.Fprintf(e.Stdout, "running:  yes, %s mode, node %s\nguarded:  %s\n", st.Mode, st.NodeID, guarded)
	if st.CredentialExpiresAt != "" {
		fmt.Fprintf(e.Stdout, "credential expires: %s\n", st.CredentialExpiresAt)
	}
	return nil
}
