package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/allowance"
	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/inbox"
	"agentmesh.dev/mesh/adapter/registrar"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/protocol"
)

func init() {
	register(&command{name: "allowance", usage: "set <amount> [--per-1k-tokens <price>] [--context <name>] [--scope task] [--on-exhausted ask-owner] | show | clear",
		summary: "limit the agent's own model spending",
		help: `The owner's limit on what the agent's command may spend, as one document
signed by the owner key in the state directory. Each run of the command
(command mode) is metered: tokens = ceil(characters / 4) of prompt plus
output, priced by --per-1k-tokens and floored to the micro-unit, and
accounted to its task, its context and the UTC day. Work that does not fit
the tightest remaining ceiling is refused with BUDGET_INSUFFICIENT quoting
its price, or with --on-exhausted ask-owner held in the inbox for you.
A stored policy that fails verification refuses everything until another
"set" signs a new one.

  set <amount>            the ceiling: per UTC day, or per --context <name>,
                          or per task with --scope task ("$5.00" is USD;
                          "5.00 EUR" names the currency)
  --per-1k-tokens <price> the price of 1,000 tokens; required the first time
  show                    the policy and what is left under each ceiling
  clear                   remove the policy (the spend record stays)

Example:
  mesh-adapter allowance set '$2.00' --per-1k-tokens '$0.01'
  mesh-adapter allowance set '$0.50' --scope task --on-exhausted ask-owner
  mesh-adapter allowance show`,
		run: runAllowance})
	register(&command{name: "contacts", usage: "export [--out <file>]",
		summary: "write a roster of contacts signed by the owner key",
		help: `Writes an admission roster signed by the owner key: every agent this
adapter has exchanged messages with (it replied to their message, sent
them one, or got their reply) is a contact ("allow"); a sender that only
reached the inbox (unread, acknowledged or refused) is not. Other
registered agents are held for review and anonymous senders blocked. It is
written to stdout, or to --out (mode 0600). The admission service takes it
as the roster of a guarded inbox.

Example:
  mesh-adapter contacts export --out roster.json`,
		run: runContacts})
	register(&command{name: "pair", usage: "<handle> <code>",
		summary: "bind this agent to a handle with a pairing code",
		help: `Signs the pairing code (from the console, or from "join") with the agent
key and submits it to the registrar, binding the handle to this agent. A
code is single use and lasts ten minutes.

Example:
  mesh-adapter pair helper.ana@example.org KDX-4M7`,
		run: runPair})
	register(&command{name: "join", usage: "[--email <address>] [--name <name>] [--operator <name>]",
		summary: "claim a handle by email and bind this agent to it",
		help: `Interactive: asks for your email, sends a code to it, asks for the code,
asks for the name (an empty answer keeps the agent's own name), claims
<name>.<email> (asking for an operator name the first time), then pairs
this agent with the new handle. Needs the registrar (--registrar-url) and
an identity (run "up" first).

Example:
  mesh-adapter join --email ana@example.org --name helper`,
		run: runJoin})
}

func runAllowance(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("allowance", flag.ContinueOnError)
	per1k := fs.String("per-1k-tokens", "", "price of 1,000 tokens")
	ctxName := fs.String("context", "", "a ceiling for this context only")
	scope := fs.String("scope", "", `"task": a ceiling per task`)
	onEx := fs.String("on-exhausted", "", `"ask-owner" holds work for you; "refuse" refuses it`)
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError("say set, show or clear")
	}
	if a := pos[0]; a != "set" && a != "show" && a != "clear" {
		return usageError("unknown allowance action %q: say set, show or clear", a)
	}
	dir, id, ks, err := e.identity()
	if err != nil {
		return err
	}
	st, err := allowance.Open(dir.Path, id.AgentID, ks.Owner)
	if err != nil {
		return err
	}
	now := time.Now()
	switch pos[0] {
	case "set":
		if len(pos) != 2 {
			return usageError("give one amount: allowance set <amount>")
		}
		if *scope != "" && *scope != "task" {
			return usageError(`--scope takes only "task"`)
		}
		amount, err := allowance.ParseMoney(pos[1])
		if err != nil {
			return err
		}
		req := allowance.SetRequest{Amount: amount, Context: *ctxName, ScopeTask: *scope == "task", OnExhausted: *onEx}
		if *per1k != "" {
			p, err := allowance.ParseMoney(*per1k)
			if err != nil {
				return fmt.Errorf("--per-1k-tokens: %w", err)
			}
			req.Per1k = &p
		}
		if _, err := st.Set(req, now); err != nil {
			return err
		}
		fmt.Fprint(e.Stdout, st.Show(now).Text())
		return nil
	case "show":
		if len(pos) != 1 {
			return usageError("show takes no argument")
		}
		fmt.Fprint(e.Stdout, st.Show(now).Text())
		return nil
	case "clear":
		if len(pos) != 1 {
			return usageError("clear takes no argument")
		}
		if err := st.Clear(); err != nil {
			return err
		}
		fmt.Fprintln(e.Stdout, "allowance cleared; every invocation is admitted")
		return nil
	}
	return usageError("unknown allowance action %q: say set, show or clear", pos[0])
}

// Roster is an admission roster (upstream-notes §6.2).
type Roster struct {
	Admission string            `json:"admission"`
	OwnerKey  string            `json:"owner_key"`
	Defaults  map[string]string `json:"defaults"`
	Entries   []RosterEntry     `json:"entries"`
	UpdatedAt string            `json:"updated_at"`
	Sig       string            `json:"sig,omitempty"`
}

// RosterEntry is one contact.
type RosterEntry struct {
	Subject   string `json:"subject"`
	Stance    string `json:"stance"`
	Note      string `json:"note,omitempty"`
	UpdatedAt string `json:"updated_at"`
}

func runContacts(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("contacts", flag.ContinueOnError)
	out := fs.String("out", "", "write to this file instead of stdout")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] != "export" {
		return usageError("say export")
	}
	dir, _, ks, err := e.identity()
	if err != nil {
		return err
	}
	r, err := signedRoster(dir, ks)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if *out == "" {
		_, err = e.Stdout.Write(b)
		return err
	}
	if err := os.WriteFile(*out, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	fmt.Fprintf(e.Stdout, "wrote a roster of %d contacts, signed by owner key %s, to %s\n", len(r.Entries), ks.Owner.Public(), *out)
	return nil
}

// signedRoster is the admission roster of `contacts export`: every known
// contact allowed, other registered agents held, anonymous senders
// blocked, signed by the owner key.
func signedRoster(dir *state.Dir, ks state.Keys) (Roster, error) {
	contacts, err := knownContacts(dir)
	if err != nil {
		return Roster{}, err
	}
	now := protocol.FormatTime(time.Now())
	r := Roster{Admission: "v1", OwnerKey: ks.Owner.Public(),
		Defaults: map[string]string{"contact": "allow", "registered": "hold", "anonymous": "block"}, Entries: []RosterEntry{}, UpdatedAt: now}
	for _, c := range contacts {
		r.Entries = append(r.Entries, RosterEntry{Subject: c, Stance: "allow", Note: "exchanged messages", UpdatedAt: now})
	}
	if r.Sig, err = protocol.SignRoster(r, ks.Owner); err != nil {
		return Roster{}, fmt.Errorf("sign the roster: %w", err)
	}
	return r, nil
}

// knownContacts are the agents this adapter has exchanged messages with
// (inbox.Queue.Contacts: replied to, sent to, or answered by), not every
// sender that reached the inbox. The queue belongs to the running adapter;
// without one, it is read directly.
func knownContacts(dir *state.Dir) ([]string, error) {
	var out []string
	if err := callDir(dir, "contacts", &out); err == nil {
		return out, nil
	} else if !errors.Is(err, control.ErrNotRunning) {
		return nil, err
	}
	q, err := inbox.Open(dir.File(state.InboxFile), time.Second)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	return q.Contacts()
}

func runPair(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("pair", flag.ContinueOnError)
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError("give the handle and the code")
	}
	dir, rc, id, ks, err := e.registrarClient()
	if err != nil {
		return err
	}
	handle, err := rc.CompletePairing(ctx, pos[1], ks.Agent)
	if err != nil {
		return err
	}
	if handle == "" {
		handle = pos[0]
	} else if !strings.EqualFold(strings.TrimSpace(handle), strings.TrimSpace(pos[0])) {
		fmt.Fprintf(e.Stdout, "note: that code was for %s, not %s\n", handle, pos[0])
	}
	id.Handle = handle
	if err := dir.SaveIdentity(id); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "%s is now bound to agent %s\n", handle, id.AgentID)
	return nil
}

// registrarClient opens the state, its identity and the registrar it
// names.
func (e *Env) registrarClient() (*state.Dir, *registrar.Client, state.Identity, state.Keys, error) {
	dir, id, ks, err := e.identity()
	if err != nil {
		return nil, nil, state.Identity{}, state.Keys{}, err
	}
	conf, err := dir.Config()
	if err != nil {
		return nil, nil, state.Identity{}, state.Keys{}, err
	}
	url := firstNonEmpty(e.RegistrarURL, conf.RegistrarURL)
	if url == "" {
		return nil, nil, state.Identity{}, state.Keys{}, usageError("no registrar: pass --registrar-url (meshd prints it) or set MESH_REGISTRAR_URL")
	}
	return dir, registrar.New(url), id, ks, nil
}

func runJoin(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	email := fs.String("email", "", "your email address")
	name := fs.String("name", "", "the name part of the handle")
	operator := fs.String("operator", "", "your operator name (asked the first time)")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	dir, rc, id, ks, err := e.registrarClient()
	if err != nil {
		return err
	}
	in := bufio.NewReader(e.Stdin)
	ask := func(prompt, current string) (string, error) {
		if current != "" {
			return current, nil
		}
		fmt.Fprint(e.Stdout, prompt)
		line, err := in.ReadString('\n')
		line = strings.TrimSpace(line)
		if line == "" && err != nil {
			return "", fmt.Errorf("no answer to %q", strings.TrimSpace(prompt))
		}
		return line, nil
	}
	if *email, err = ask("Email address: ", *email); err != nil {
		return err
	}
	if err := rc.StartEmail(ctx, *email); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "A 6-digit code was sent to %s.\n", *email)
	code, err := ask("Code: ", "")
	if err != nil {
		return err
	}
	token, err := rc.Verify(ctx, *email, code)
	if err != nil {
		return err
	}
	if *name == "" {
		// The agent's own name is the default: an empty answer keeps it.
		prompt := "Agent name (the handle will be <name>." + *email + "): "
		if id.Name != "" {
			prompt = "Agent name [" + id.Name + "] (the handle will be <name>." + *email + "): "
		}
		fmt.Fprint(e.Stdout, prompt)
		line, rerr := in.ReadString('\n')
		if *name = firstNonEmpty(strings.TrimSpace(line), id.Name); *name == "" && rerr != nil {
			return fmt.Errorf("no answer to %q", strings.TrimSpace(prompt))
		}
	}
	handle, err := rc.Claim(ctx, token, *name, *operator)
	if errors.Is(err, registrar.ErrOperatorRequired) {
		if *operator, err = ask("Operator name (shown on your cards): ", ""); err != nil {
			return err
		}
		handle, err = rc.Claim(ctx, token, *name, *operator)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "Claimed %s.\n", handle)
	pairCode, err := rc.StartPairing(ctx, token, handle)
	if err != nil {
		return err
	}
	if _, err := rc.CompletePairing(ctx, pairCode, ks.Agent); err != nil {
		return err
	}
	id.Handle = handle
	if err := dir.SaveIdentity(id); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "%s is now bound to agent %s\n", handle, id.AgentID)
	return nil
}
