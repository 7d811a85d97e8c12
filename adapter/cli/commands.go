package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/inbox"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

func init() {
	register(&command{name: "start", usage: "(--inbox --name <name> | --cmd <command> [--raw]) [--skus <file>]",
		summary: "run the adapter: hold messages (inbox mode) or answer them with a command",
		help: `Runs the adapter until interrupted, and prints the agent id.

--inbox --name <name>   inbox mode: every message waits in the local queue
                        (it survives restarts) until you answer it with
                        "reply" or "ack"; senders get a "queued" receipt.
--cmd <command>         command mode: each message is piped to a fresh run
                        of <command> (through /bin/sh -c) on stdin, framed
                        with who sent it; its stdout is the answer. A failing
                        command answers with an error the sender can read.
--raw                   with --cmd: pipe the bare text, without the frame.
--skus <file>           what the agent sells: a JSON array of SKUs
                        (docs/commerce.md), checked, saved in the state
                        directory and published with every registration;
                        "none" stops selling. See "mesh-adapter skus".

The identity comes from "up". Without one, the adapter leases a guest
(sandbox) identity that ends when it stops.

Example:
  mesh-adapter start --inbox --name helper
  mesh-adapter start --cmd 'tr a-z A-Z' --name shouter`,
		run: runStart})
	register(&command{name: "up", usage: "<agent-key> [--name <name>] [--skus <file>]",
		summary: "redeem an agent key (am_...) and start the inbox",
		help: `Redeems a single-use agent key minted in the console (or with
"meshd admin agent-token"), saves the new identity and its 30-day credential
in the state directory before connecting, names the agent, and starts the
adapter in inbox mode. The credential is renewed automatically.
--skus <file> sets what the agent sells, as for "start".

Example:
  mesh-adapter --control-url http://127.0.0.1:8080 up am_3kq... --name helper`,
		run: runUp})
	register(&command{name: "inbox", usage: "[--json] [--all]",
		summary: "list the messages waiting in the running adapter",
		help: `Lists unread messages with who sent them. --all includes replied,
refused and acknowledged ones; --json prints them as JSON, with each
budget_line.

Example:
  mesh-adapter inbox
  mesh-adapter inbox --json`,
		run: runInbox})
	register(&command{name: "reply", usage: `<id> "<text>" | <id> --refuse-budget <estimate> ["<note>"]`,
		summary: "answer a message, or refuse it on budget",
		help: `Answers message <id> (its number from "inbox", or its id) in the same trace.

--refuse-budget <estimate> refuses it instead:
  a money estimate ("$5.00" means USD, "5.00 EUR" names the currency)
  answers BUDGET_INSUFFICIENT with details.estimate in micro-units;
  a time (an RFC 3339 instant, or a duration such as 2h, 90m, 1h30m)
  answers DEADLINE_UNMEETABLE with details.earliest_completion.
  A bare number such as 5.00 is ambiguous and refused here.

Example:
  mesh-adapter reply 3 "Done: the report is attached."
  mesh-adapter reply 4 --refuse-budget '$12.50' "needs the large model"`,
		run: runReply})
	register(&command{name: "ack", usage: "<id...>",
		summary: "mark messages seen without replying",
		help: `Marks the messages read without answering them.

Example:
  mesh-adapter ack 1 2`,
		run: runAck})
	register(&command{name: "send", usage: `<handle-or-agent-id> "<text>" [--wait <seconds>] [--accept-new-binding]`,
		summary: "send a message and print the reply",
		help: `Sends a text message to an agent (its id, or a handle resolved through the
registrar) and prints the reply. --wait is how long to wait in seconds (30;
more than 0, at most 3600). Through
the running adapter when there is one; otherwise the agent comes up just
for this.

A recipient in inbox mode holds the message for a person: send then says
"delivered; waiting for a person to answer" and exits 3 at once, and the
answer comes later to "mesh-adapter inbox". Given --wait explicitly, send
waits that long for the person's answer first.

Exit status: 0 answered (the answer on stdout), 1 nothing was sent (the
line says why), 2 usage, 3 held for a person (or by the mesh), 4 the
recipient answered with an error (its code and message), 5 no answer
within --wait.

A handle's card must carry the registrar's signature, checked with the
registrar key pinned in pins.json on first use. The agent a handle
resolves to is pinned too: when it changes, send prints a warning and
sends nothing. --accept-new-binding sends to the new agent and pins it.

Example:
  mesh-adapter send UAB3...XYZ "what time is it?" --wait 60
  mesh-adapter send helper.ana@example.org "hello"`,
		run: runSend})
	register(&command{name: "whoami", usage: "[--json]",
		summary: "print this adapter's agent id and handle",
		help: `Prints the agent id and handle from the state directory (no network).

Example:
  mesh-adapter whoami --json`,
		run: runWhoami})
}

// logger is what a long-lived command logs to: warnings and errors on
// stderr, as text.
func (e *Env) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(e.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func runStart(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	inboxMode := fs.Bool("inbox", false, "inbox mode")
	cmd := fs.String("cmd", "", "command mode: the command to run per message")
	name := fs.String("name", "", "the agent's name")
	raw := fs.Bool("raw", false, "pipe bare text to the command")
	skus := fs.String("skus", "", `a JSON file of the SKUs the agent sells, saved in the state directory ("none" stops selling)`)
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageError("unexpected argument %q", pos[0])
	case *inboxMode == (*cmd != ""):
		return usageError("choose one of --inbox or --cmd <command>")
	case *inboxMode && *name == "":
		return usageError("--inbox needs --name <name>")
	case *raw && *cmd == "":
		return usageError("--raw only applies to --cmd")
	}
	dir, err := e.openState()
	if err != nil {
		return err
	}
	if err := saveSKUsFlag(dir, *skus); err != nil {
		return err
	}
	cfg := daemon.Config{Dir: dir, Mode: daemon.ModeInbox, Name: *name, Command: *cmd, Raw: *raw,
		ControlURL: e.ControlURL, RegistrarURL: e.RegistrarURL, Out: e.Stdout, Log: e.logger()}
	if *cmd != "" {
		cfg.Mode = daemon.ModeCmd
	}
	return daemon.Run(ctx, cfg)
}

func runUp(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	name := fs.String("name", "", "the agent's name (default: the key's label)")
	skus := fs.String("skus", "", `a JSON file of the SKUs the agent sells, saved in the state directory ("none" stops selling)`)
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("give exactly one agent key")
	}
	key := strings.TrimSpace(pos[0])
	if !strings.HasPrefix(key, "am_") {
		return usageError("%q is not an agent key: they start with am_", key)
	}
	dir, err := e.openState()
	if err != nil {
		return err
	}
	conf, err := dir.Config()
	if err != nil {
		return err
	}
	// An identity that is not a guest's and has no credential of its own
	// was saved by an earlier `up` whose exchange failed or whose answer
	// was lost: it is reused, so the retry asks for the same agent_id.
	id, err := dir.Identity()
	retry := false
	switch {
	case err == nil && !id.Guest:
		if conf.Credential != nil && conf.Credential.Kind != "guest" {
			return fmt.Errorf("this state directory already belongs to agent %s (%s); use another --state-dir for a second agent", id.AgentID, id.Name)
		}
		retry = true
	case err != nil && !errors.Is(err, state.ErrNoIdentity):
		return err
	}
	conf.ControlURL = firstNonEmpty(e.ControlURL, conf.ControlURL)
	conf.RegistrarURL = firstNonEmpty(e.RegistrarURL, conf.RegistrarURL)
	if conf.ControlURL == "" {
		return usageError("no control URL: pass --control-url (meshd prints it) or set MESH_CONTROL_URL")
	}
	if err := saveSKUsFlag(dir, *skus); err != nil {
		return err
	}
	// The identity is saved (durably) before the key is spent, and the
	// credential right after: a crash or a lost answer in between leaves an
	// identity to retry with, never a spent key with nothing to show for it.
	if retry {
		fmt.Fprintf(e.Stdout, "retrying as agent %s, saved in %s by an earlier up that did not finish\n", id.AgentID, dir.Path)
		if *name != "" && *name != id.Name {
			id.Name = *name
			if err := dir.SaveIdentity(id); err != nil {
				return err
			}
		}
	} else {
		if id, err = state.NewIdentity(*name, nil); err != nil {
			return err
		}
		if err := dir.SaveIdentity(id); err != nil {
			return err
		}
	}
	ks, err := id.Keys()
	if err != nil {
		return err
	}
	fmt.Fprintln(e.Stdout, "redeeming the agent key...")
	r, err := daemon.Bootstrap(ctx, conf.ControlURL, key, ks.Agent, nil)
	if err != nil {
		return upFailed(err, id, dir, retry)
	}
	// The services key is learned again from this control plane at the
	// next start (a key redeemed on another mesh must not keep the pin).
	conf.Credential, conf.NATSURLs, conf.ServicesKey = r.Credential, r.NATSURLs, ""
	if err := dir.SaveConfig(conf); err != nil {
		return fmt.Errorf("the agent key is spent but its credential could not be saved: %w", err)
	}
	id.Name = firstNonEmpty(*name, r.Label, "agent")
	id.Handle = r.Handle
	// The credential's key is the node key from now on: the node
	// credential it is renewed for binds to the node key, and the
	// connection's private reply prefix is named after it, so the two must
	// be one key for the prefix to survive renewal.
	id.NodeSeed = r.Credential.Seed
	if _, err := id.Keys(); err != nil {
		return fmt.Errorf("the credential's key cannot serve as the node key: %w", err)
	}
	if err := dir.SaveIdentity(id); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "saved agent %s (%s) in %s\n", id.AgentID, id.Name, dir.Path)
	return daemon.Run(ctx, daemon.Config{Dir: dir, Mode: daemon.ModeInbox, ControlURL: conf.ControlURL,
		RegistrarURL: conf.RegistrarURL, Out: e.Stdout, Log: e.logger()})
}

// upFailed explains a failed exchange: the identity stays, and what to do
// next depends on whether the control plane answered.
func upFailed(err error, id state.Identity, dir *state.Dir, retry bool) error {
	switch st := daemon.HTTPStatus(err); {
	case st == http.StatusUnauthorized:
		// One answer for a key that is unknown, used, revoked or expired:
		// the control plane does not say which, so an earlier attempt here
		// that spent the key and lost the answer looks the same.
		earlier := ""
		if retry {
			earlier = fmt.Sprintf(" If the earlier up here spent it and its answer was lost, it is now used by agent %s (the account owns that agent), and a key works only once.", id.AgentID)
		}
		return fmt.Errorf("%w\nThis agent key cannot be exchanged.%s Mint a new agent key in the console and run `mesh-adapter up <new-key>` with this state directory (%s): it reuses agent %s",
			err, earlier, dir.Path, id.AgentID)
	case st == 0 || st >= 500:
		return fmt.Errorf("%w\nThe exchange did not complete, so the key may or may not be spent. Agent %s is saved in %s: run the same `mesh-adapter up <agent-key>` again to retry as that agent (a `start` or `send` will not lease a guest over it)",
			err, id.AgentID, dir.Path)
	default:
		return fmt.Errorf("%w\nAgent %s is saved in %s; `mesh-adapter up <agent-key>` there retries as that agent", err, id.AgentID, dir.Path)
	}
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// call asks the running adapter.
func (e *Env) call(r control.Request, out any, timeout time.Duration) error {
	dir, err := e.openState()
	if err != nil {
		return err
	}
	return control.Call(dir.File(state.SocketFile), r, out, timeout)
}

// callDir asks the adapter running on dir a question without arguments.
func callDir(dir *state.Dir, op string, out any) error {
	return control.Call(dir.File(state.SocketFile), control.Request{Op: op, All: true}, out, 10*time.Second)
}

func runInbox(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("inbox", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	all := fs.Bool("all", false, "include replied and acknowledged messages")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	var msgs []inbox.Message
	if err := e.call(control.Request{Op: "inbox", All: *all}, &msgs, 10*time.Second); err != nil {
		return err
	}
	if *asJSON {
		type item struct {
			Seq        uint64          `json:"seq"`
			Kind       string          `json:"kind"`
			InReplyTo  string          `json:"in_reply_to,omitempty"`
			ID         string          `json:"id"`
			From       string          `json:"from"`
			Handle     string          `json:"handle,omitempty"`
			Text       string          `json:"text"`
			Framed     string          `json:"framed"`
			TraceID    string          `json:"trace_id,omitempty"`
			BudgetLine string          `json:"budget_line"`
			Budget     json.RawMessage `json:"budget,omitempty"`
			ReceivedAt string          `json:"received_at"`
			State      string          `json:"state"`
		}
		out := make([]item, 0, len(msgs))
		for _, m := range msgs {
			out = append(out, item{Seq: m.Seq, Kind: m.Kind, InReplyTo: m.InReplyTo, ID: m.ID, From: m.From, Handle: m.Handle, Text: m.Text, Framed: m.Framed,
				TraceID: m.TraceID, BudgetLine: m.BudgetLine, Budget: m.Budget, ReceivedAt: m.ReceivedAt, State: m.State})
		}
		enc := json.NewEncoder(e.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(msgs) == 0 {
		fmt.Fprintln(e.Stdout, "no messages")
		return nil
	}
	for _, m := range msgs {
		from := "agent " + m.From + "  (no registered name)"
		if m.Handle != "" {
			from = m.Handle + "  (verified handle)"
		}
		kind := ""
		switch m.Kind {
		case inbox.KindReply:
			kind = "  (a reply to your message " + m.InReplyTo + ")"
		case inbox.KindUnsolicited:
			kind = "  (an unsolicited answer from " + m.From + " naming message " + daemon.OneLine(m.InReplyTo) + ", which this agent did not send to it)"
		}
		fmt.Fprintf(e.Stdout, "#%d  %s  %s%s\n    from:  %s\n", m.Seq, m.ReceivedAt, m.State, kind, from)
		if m.BudgetLine != "" {
			fmt.Fprintf(e.Stdout, "    %s\n", m.BudgetLine)
		}
		// The sender's words, fenced (no control characters, nothing that
		// reads as a frame marker) and each line marked as theirs.
		for _, line := range strings.Split(protocol.Fence(m.Text), "\n") {
			fmt.Fprintf(e.Stdout, "    | %s\n", line)
		}
	}
	return nil
}

func runReply(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("reply", flag.ContinueOnError)
	refuse := fs.String("refuse-budget", "", "refuse on budget with this estimate")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	var m inbox.Message
	switch {
	case *refuse != "":
		if len(pos) < 1 || len(pos) > 2 {
			return usageError(`give the message id and, optionally, a note: reply <id> --refuse-budget <estimate> ["<note>"]`)
		}
		note := ""
		if len(pos) == 2 {
			note = pos[1]
		}
		if err := e.call(control.Request{Op: "refuse", Ref: pos[0], Estimate: *refuse, Text: note}, &m, 30*time.Second); err != nil {
			return err
		}
		fmt.Fprintf(e.Stdout, "refused #%d on budget\n", m.Seq)
		return nil
	case len(pos) != 2:
		return usageError(`give the message id and the text: reply <id> "<text>"`)
	}
	if err := e.call(control.Request{Op: "reply", Ref: pos[0], Text: pos[1]}, &m, 30*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "replied to #%d\n", m.Seq)
	return nil
}

func runAck(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("ack", flag.ContinueOnError)
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError("give at least one message id")
	}
	var acked []inbox.Message
	if err := e.call(control.Request{Op: "ack", Refs: pos}, &acked, 10*time.Second); err != nil {
		return err
	}
	for _, m := range acked {
		fmt.Fprintf(e.Stdout, "acknowledged #%d\n", m.Seq)
	}
	return nil
}

func runSend(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	wait := fs.Float64("wait", 30, "seconds to wait for the reply")
	accept := fs.Bool("accept-new-binding", false, "send even though the handle's agent changed since it was pinned, and pin the new one")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError(`give the recipient and the text: send <handle-or-agent-id> "<text>"`)
	}
	// NaN fails every comparison, and a huge or infinite value overflows
	// the duration into a deadline already past: only a finite, sensible
	// range is accepted.
	if !(*wait > 0 && *wait <= maxWait) {
		return usageError("--wait must be a number of seconds greater than 0 and at most %d", maxWait)
	}
	// An explicit --wait also waits for the answer of a person behind an
	// inbox-mode recipient; by default its queued acknowledgement ends the
	// send at once.
	waitHeld := false
	fs.Visit(func(f *flag.Flag) { waitHeld = waitHeld || f.Name == "wait" })
	opt := daemon.SendOptions{AcceptNewBinding: *accept, WaitHeld: waitHeld, RegistrarURL: e.RegistrarURL}
	var res daemon.SendResult
	err = e.call(control.Request{Op: "send", To: pos[0], Text: pos[1], WaitSeconds: *wait, AcceptNewBinding: *accept, WaitHeld: waitHeld,
		RegistrarURL: e.RegistrarURL}, &res, time.Duration(*wait*float64(time.Second))+15*time.Second)
	if errors.Is(err, control.ErrNotRunning) {
		dir, derr := e.openState()
		if derr != nil {
			return derr
		}
		var r *daemon.SendResult
		r, err = daemon.Send(ctx, daemon.Config{Dir: dir, ControlURL: e.ControlURL, RegistrarURL: e.RegistrarURL, Out: e.Stderr, Log: e.logger()},
			pos[0], pos[1], time.Duration(*wait*float64(time.Second)), opt)
		if r != nil {
			res = *r
		}
	}
	if err != nil {
		return err
	}
	return sendOutcome(e.Stdout, pos[0], &res, *wait, waitHeld)
}

// sendOutcome prints the answer of a send, or returns what became of the
// message with its exit status.
func sendOutcome(stdout io.Writer, to string, res *daemon.SendResult, wait float64, waited bool) error {
	switch {
	case res.Error != nil && res.Error.Code == errs.AgreementRequired:
		return &exitError{code: exitAnswerError, err: errors.New(daemon.AgreementRequiredLine(to, res.Error))}
	case res.Error != nil:
		return &exitError{code: exitAnswerError, err: fmt.Errorf("%s answered with an error: %s", to, daemon.OneLine(daemon.Describe(res.Error).Error()))}
	case res.Queued && res.From == res.To:
		msg := "delivered; waiting for a person to answer"
		if waited {
			msg += fmt.Sprintf(" (no answer within %gs)", wait)
		}
		return &exitError{code: exitQueued, err: fmt.Errorf("%s: the answer to request %s will appear in `mesh-adapter inbox`", msg, res.RequestID)}
	case res.Queued:
		return &exitError{code: exitQueued, err: fmt.Errorf("queued by the mesh for %s (it is offline or screens its messages): an answer to request %s, if one comes, will appear in `mesh-adapter inbox`", to, res.RequestID)}
	case res.NoAnswer:
		return &exitError{code: exitNoAnswer, err: fmt.Errorf("no answer from %s within %gs: the recipient's adapter may not be running (the mesh keeps the message for it if it has a mailbox)", to, wait)}
	}
	fmt.Fprintln(stdout, res.Text)
	return nil
}

// maxWait is the longest send --wait (an hour): longer, use the inbox.
const maxWait = 3600

func runWhoami(_ context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("whoami", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	dir, err := e.openState()
	if err != nil {
		return err
	}
	id, err := dir.Identity()
	if err != nil {
		return err
	}
	if *asJSON {
		var handle any
		if id.Handle != "" {
			handle = id.Handle
		}
		return json.NewEncoder(e.Stdout).Encode(map[string]any{"agent_id": id.AgentID, "handle": handle})
	}
	fmt.Fprintf(e.Stdout, "agent id: %s\nname:     %s\n", id.AgentID, id.Name)
	if id.Handle != "" {
		fmt.Fprintf(e.Stdout, "handle:   %s\n", id.Handle)
	}
	if id.Guest {
		fmt.Fprintln(e.Stdout, "(a guest identity: it ends with its lease)")
	}
	return nil
}
