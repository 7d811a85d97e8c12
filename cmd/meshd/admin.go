package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
)

const adminUsage = `Usage: meshd admin [--data-dir DIR] [--json] COMMAND …

Operator commands on the server host. They act on the same store and keys as
the meshd running on DIR (through its admin socket), or on the stopped mesh's
files when none is running. Flags may come before or after the command's words.

Commands:
%s
Flags of every command:
  --data-dir DIR   the mesh's data directory (env MESHD_DATA_DIR, default ./.mesh)
  --json           print one JSON object instead of text

meshd admin COMMAND --help (or meshd help admin COMMAND) explains one command.

Example:
  meshd admin account create --email ana@example.org
  meshd admin agent-token --account acct_… --name coder --operator "Ana López"
`

// adminArgs are a command line's words after the command's own, and its flags.
type adminArgs struct {
	pos   []string
	flags map[string]string
}

// adminCommand is one operator command and the admin-socket call it makes.
type adminCommand struct {
	words    string   // the command's words, e.g. "account create"
	args     []string // its positional arguments, e.g. {"ID"}
	flags    []string // its flags (beyond --data-dir and --json), as shown in its synopsis
	required []string // the flags it cannot do without
	summary  string   // one line for the command list
	help     string   // what it does, in a few lines
	call     func(a adminArgs) (path string, body map[string]any, show func(map[string]any) string)
	// finish, when set, acts on the answer on this side of the socket (the
	// operator credential is written to a file here) and returns what is
	// printed instead of it.
	finish func(a adminArgs, dataDir string, res map[string]any) (map[string]any, error)
}

// placeholders name the value of each flag in synopses.
var placeholders = map[string]string{"email": "E", "reason": "R", "account": "ID", "name": "NAME", "operator": "NAME",
	"ttl": "DURATION", "out": "FILE", "label": "TEXT"}

func (c adminCommand) synopsis() string {
	parts := append([]string{c.words}, c.args...)
	for _, f := range c.flags {
		p := "--" + f + " " + placeholders[f]
		if !slices.Contains(c.required, f) {
			p = "[" + p + "]"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// usage is one command's help.
func (c adminCommand) usage() string {
	return fmt.Sprintf("Usage: meshd admin %s [--data-dir DIR] [--json]\n\n%s\n", c.synopsis(), c.help)
}

var adminCommands = []adminCommand{
	{
		words: "account create", flags: []string{"email"}, required: []string{"email"},
		summary: "create an account (or find it)",
		help: `Creates the account of address E, or finds the one it already has. The
person signs in to the console with a code mailed to E.
  --email E   the account's email address`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			return "/admin/accounts", map[string]any{"email": a.flags["email"]}, func(r map[string]any) string {
				if r["created"] == true {
					return fmt.Sprintf("created account %s for %s", r["account_id"], r["email"])
				}
				return fmt.Sprintf("account %s already exists for %s", r["account_id"], r["email"])
			}
		},
	},
	{
		words: "account disable", args: []string{"ID"}, flags: []string{"reason"},
		summary: "disable an account and revoke its credentials",
		help: `Disables account ID: its sessions, tokens and agents' credentials stop
working at once.
  --reason R   why, shown to whoever tries to use them (default "disabled by the operator")`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			id := a.pos[0]
			return "/admin/accounts/" + id + "/disable", map[string]any{"reason": a.flags["reason"]},
				func(map[string]any) string { return "account " + id + " disabled; its credentials are revoked" }
		},
	},
	{
		words: "agent-token", flags: []string{"account", "name", "operator"}, required: []string{"account", "name"},
		summary: "mint a single-use agent key (am_…), valid 7 days",
		help: `Mints a single-use agent key for account ID. The agent's machine runs
the command printed with it within 7 days.
  --account ID      the account the agent joins
  --name NAME       the agent's name; a name with no spaces and no @ also claims
                    the handle NAME.<account email> for the agent when it starts,
                    and the answer says whether it will
  --operator NAME   the account's operator name (the person or organisation others
                    see running its agents), when it has none yet; needed once
                    for any handle`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			body := map[string]any{"account": a.flags["account"], "name": a.flags["name"]}
			if op, ok := a.flags["operator"]; ok {
				body["operator_name"] = op
			}
			return "/admin/agent-tokens", body, func(r map[string]any) string {
				out := fmt.Sprintf("%s\n\nSingle use, valid 7 days. On the agent's machine run:\n  %s", r["token"], r["command"])
				if note, _ := r["handle_note"].(string); note != "" {
					out += "\n\n" + note
				}
				return out
			}
		},
	},
	{
		words: "agent retire", args: []string{"ID"}, flags: []string{"reason"}, required: []string{"reason"},
		summary: "retire an agent and revoke its credentials",
		help: `Retires agent ID (its public key): its credentials stop working at once
and it cannot come back with the same key.
  --reason R   why, shown to the agent's node when it is refused`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			id := a.pos[0]
			return "/admin/agents/" + id + "/retire", map[string]any{"reason": a.flags["reason"]},
				func(map[string]any) string { return "agent " + id + " retired; its credentials are revoked" }
		},
	},
	{
		words: "catalog official", args: []string{"AGENT", "on|off"},
		summary: "mark a catalog entry official, or not",
		help: `Sets whether agent AGENT (its public key) is official in the catalog
(mesh.catalog.list), over the configured list (MESH_CATALOG_OFFICIAL). The
agent must be in the catalog: it registered publicly at least once and was
not removed. Needs the running meshd (the catalog lives on the bus).`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			id, on := a.pos[0], a.pos[1]
			return "/admin/catalog/" + id + "/official", map[string]any{"official": on}, func(map[string]any) string {
				if on == "on" {
					return "agent " + id + " is official in the catalog"
				}
				return "agent " + id + " is not official in the catalog"
			}
		},
	},
	{
		words: "catalog remove", args: []string{"AGENT"},
		summary: "remove an agent's catalog entry",
		help: `Removes agent AGENT's entry from the catalog. It stays out, even when the
agent registers again, until you lift the removal with "meshd admin catalog
restore AGENT"; to keep an agent off the mesh, retire it. Needs the running
meshd (the catalog lives on the bus).`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			id := a.pos[0]
			return "/admin/catalog/" + id + "/remove", map[string]any{}, func(r map[string]any) string {
				if r["removed"] == true {
					return "agent " + id + " removed from the catalog"
				}
				return "agent " + id + " was not in the catalog; nothing to remove"
			}
		},
	},
	{
		words: "catalog restore", args: []string{"AGENT"},
		summary: "lift the removal of an agent's catalog entry",
		help: `Lifts your removal of agent AGENT's catalog entry: its current public
registration is listed again at once, or, when it has none, its next one.
Needs the running meshd (the catalog lives on the bus).`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			id := a.pos[0]
			return "/admin/catalog/" + id + "/restore", map[string]any{}, func(r map[string]any) string {
				switch {
				case r["restored"] != true:
					return "agent " + id + " was not removed by the operator; nothing to restore"
				case r["listed"] == true:
					return "agent " + id + " is back in the catalog"
				}
				return "agent " + id + " will be listed again when it next registers publicly"
			}
		},
	},
	{
		words: "credits grant", args: []string{"OWNER", "AMOUNT"}, flags: []string{"reason"},
		summary: "credit an owner's balance with credits (XCR)",
		help: `Credits owner OWNER (the owner's public key, U…: an agent's registered
owner, as mesh-adapter credits prints it) with AMOUNT credits, such as 25 or
2.5 (1 credit = 1,000,000 micro-credits). Credits are spent inside the mesh
on paid SKUs; there is no withdrawal or payout. Each run grants again. Needs
the running meshd (the balances live on the bus).
  --reason R   why, shown in the owner's credit history (default "granted by the operator")`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			owner := a.pos[0]
			// Checked by the command before it runs (creditsAmount).
			micro, _ := commerce.ParseCredits(a.pos[1])
			body := map[string]any{"credits": micro}
			if r := a.flags["reason"]; r != "" {
				body["reason"] = r
			}
			return "/admin/credits/" + owner + "/grant", body, func(r map[string]any) string {
				bal, _ := r["credits"].(float64)
				return fmt.Sprintf("granted %s credits to %s; its balance is %s credits", commerce.FormatCredits(micro), owner, commerce.FormatCredits(int64(bal)))
			}
		},
	},
	{
		words: "credits balance", args: []string{"OWNER"},
		summary: "show an owner's credits (or the platform's markup: OWNER platform)",
		help: `Shows the credit balance of owner OWNER (its public key), or with
OWNER "platform" what the platform kept as markup on the resale path. Needs
the running meshd (the balances live on the bus).`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			owner := a.pos[0]
			return "/admin/credits/" + owner + "/balance", map[string]any{}, func(r map[string]any) string {
				bal, _ := r["credits"].(float64)
				return fmt.Sprintf("%s has %s credits", owner, commerce.FormatCredits(int64(bal)))
			}
		},
	},
	{
		// Before "operator-credential": the first command whose words start
		// the line is the one run.
		words: "operator-credential revoke", args: []string{"KEY"},
		summary: "revoke an operator test credential at once",
		help: `Revokes the operator test credential with public key KEY (as minting
printed it): its connections close at once, and it is refused from then on.
On a stopped mesh the revocation is recorded and applied when meshd starts.`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			key := a.pos[0]
			return "/admin/operator-credentials/" + key + "/revoke", map[string]any{},
				func(map[string]any) string { return "operator credential " + key + " revoked" }
		},
	},
	{
		words: "operator-credential", flags: []string{"ttl", "out", "label"}, required: []string{"ttl"},
		summary: "mint a wide, short-lived test credential (mesh.> and _INBOX.>) into a creds file",
		help: `Mints the operator's test credential: one NATS user that publishes and
subscribes mesh.> and _INBOX.> (never $SYS.>, $KV.>, $JS.> or
mesh.internal.>), so it can speak for any agent key and read every agent's
traffic. It is for third-party conformance suites that assume one such
credential, on a mesh you run; read docs/security.md before using it.
The creds file is written with mode 0600 (never over an existing file);
the seed is printed nowhere and logged nowhere. The mint is logged and
recorded; revoke it with "meshd admin operator-credential revoke KEY".
  --ttl DURATION   required: how long it lives, at most 24h (e.g. 1h, 90m)
  --out FILE       where to write the creds file
                   (default DIR/operator-<key>.creds)
  --label TEXT     a note added to its name (who, which suite)`,
		call: func(a adminArgs) (string, map[string]any, func(map[string]any) string) {
			return "/admin/operator-credentials", map[string]any{"ttl": a.flags["ttl"], "label": a.flags["label"]},
				func(r map[string]any) string {
					return fmt.Sprintf("wrote %s: %s, public key %s, expires %s.\nIt reads every agent's traffic on this mesh; revoke it when the run is over:\n  meshd admin operator-credential revoke %s",
						r["creds_file"], r["name"], r["public_key"], r["expires_at"], r["public_key"])
				}
		},
		finish: writeOperatorCreds,
	},
}

// adminUsageText is the admin help with its command list.
func adminUsageText() string { return fmt.Sprintf(adminUsage, commandList(adminCommands)) }

// commandList lists commands, a synopsis and a summary each.
func commandList(cs []adminCommand) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "  %s\n      %s\n", c.synopsis(), c.summary)
	}
	return b.String()
}

// admin runs one operator command.
func admin(ctx context.Context, args []string, env lookupEnv, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meshd admin", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dataDir := "./.mesh"
	if v, ok := env("MESHD_DATA_DIR"); ok && v != "" {
		dataDir = v
	}
	fs.StringVar(&dataDir, "data-dir", dataDir, "")
	asJSON := fs.Bool("json", false, "")
	help := fs.Bool("help", false, "")
	fs.BoolVar(help, "h", false, "")
	// Every command's flags are parsed together, wherever they are; a
	// flag the command does not take is refused below.
	values := map[string]*string{}
	for _, c := range adminCommands {
		for _, f := range c.flags {
			if values[f] == nil {
				values[f] = fs.String(f, "", "")
			}
		}
	}
	words, err := parseAnywhere(fs, args)
	if err != nil {
		return usageErr(stderr, err.Error(), adminUsageText())
	}
	if i := slices.Index(words, "help"); i >= 0 || *help {
		if i >= 0 {
			words = words[:i]
		}
		fmt.Fprint(stdout, adminHelp(words))
		return flag.ErrHelp
	}
	cmd, ok := findAdminCommand(words)
	if !ok {
		if len(words) == 0 {
			return usageErr(stderr, "which command?", adminUsageText())
		}
		if commandsUnder(words) != nil {
			return usageErr(stderr, strings.Join(words, " ")+" needs a command", adminHelp(words))
		}
		return usageErr(stderr, fmt.Sprintf("unknown admin command %q", strings.Join(words, " ")), adminUsageText())
	}
	a := adminArgs{pos: words[len(strings.Fields(cmd.words)):], flags: map[string]string{}}
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "data-dir" || f.Name == "json":
		case slices.Contains(cmd.flags, f.Name):
			a.flags[f.Name] = *values[f.Name]
		default:
			bad = append(bad, "--"+f.Name)
		}
	})
	switch {
	case len(bad) > 0:
		return usageErr(stderr, fmt.Sprintf("%s does not take %s", cmd.words, strings.Join(bad, ", ")), cmd.usage())
	case len(a.pos) < len(cmd.args):
		return usageErr(stderr, fmt.Sprintf("%s needs %s", cmd.words, strings.Join(cmd.args[len(a.pos):], " ")), cmd.usage())
	case len(a.pos) > len(cmd.args):
		return usageErr(stderr, fmt.Sprintf("unexpected arguments after %s: %s", cmd.words, strings.Join(a.pos[len(cmd.args):], " ")), cmd.usage())
	}
	for _, f := range cmd.required {
		if strings.TrimSpace(a.flags[f]) == "" {
			return usageErr(stderr, fmt.Sprintf("%s needs --%s %s", cmd.words, f, placeholders[f]), cmd.usage())
		}
	}
	if cmd.words == "credits grant" {
		if _, err := commerce.ParseCredits(a.pos[1]); err != nil {
			return usageErr(stderr, err.Error(), cmd.usage())
		}
	}
	if f, ok := a.flags["ttl"]; ok {
		if _, err := devenv.OperatorTTL(f); err != nil {
			return usageErr(stderr, err.Error(), cmd.usage())
		}
	}
	path, body, show := cmd.call(a)

	client, done, err := adminClient(dataDir)
	if err != nil {
		return err
	}
	defer done()
	res, err := call(ctx, client, path, body)
	if err != nil {
		return err
	}
	if cmd.finish != nil {
		if res, err = cmd.finish(a, dataDir, res); err != nil {
			return err
		}
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintln(stdout, show(res))
	return nil
}

// findAdminCommand is the command whose words start words.
func findAdminCommand(words []string) (adminCommand, bool) {
	for _, c := range adminCommands {
		w := strings.Fields(c.words)
		if len(words) >= len(w) && slices.Equal(words[:len(w)], w) {
			return c, true
		}
	}
	return adminCommand{}, false
}

// adminHelp is the help for words: one command's, the commands that start
// with them ("account"), or the whole list.
func adminHelp(words []string) string {
	if c, ok := findAdminCommand(words); ok {
		return c.usage()
	}
	if group := commandsUnder(words); len(group) > 0 {
		return fmt.Sprintf("Usage: meshd admin %s COMMAND … [--data-dir DIR] [--json]\n\nCommands:\n%s",
			strings.Join(words, " "), commandList(group))
	}
	return adminUsageText()
}

// commandsUnder are the commands whose words start with words, when words
// are not a whole command ("account": account create, account disable).
func commandsUnder(words []string) []adminCommand {
	if len(words) == 0 {
		return nil
	}
	var out []adminCommand
	for _, c := range adminCommands {
		if strings.HasPrefix(c.words+" ", strings.Join(words, " ")+" ") {
			out = append(out, c)
		}
	}
	return out
}

func usageErr(stderr io.Writer, msg, usage string) error {
	fmt.Fprintf(stderr, "meshd admin: %s\n\n%s", msg, usage)
	return errUsage
}

// adminClient talks to the meshd running on dataDir through its socket, or,
// when none is running, to the same handler in this process over the
// stopped mesh's files.
func adminClient(dataDir string) (*http.Client, func(), error) {
	sock := filepath.Join(dataDir, devenv.AdminSocket)
	if conn, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		conn.Close()
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr.CloseIdleConnections, nil
	}
	c, closeFn, err := devenv.OpenControl(dataDir, nil)
	if err != nil {
		var locked *devenv.LockedError
		switch {
		case errors.As(err, &locked) && locked.Role == "meshd":
			// Starting, or stopping: its socket is not up, and its files
			// are not ours to open.
			return nil, nil, fmt.Errorf("a meshd is running on this data dir (pid %d) but its admin socket %s does not answer: retry in a moment, or once it has stopped",
				locked.PID, sock)
		case errors.As(err, &locked):
			return nil, nil, fmt.Errorf("another %s is working on this data dir (pid %d): retry when it is done", locked.Role, locked.PID)
		}
		if _, statErr := os.Stat(dataDir); statErr != nil {
			return nil, nil, fmt.Errorf("no mesh data directory at %s (use --data-dir)", dataDir)
		}
		return nil, nil, err
	}
	h := devenv.AdminHandler(c, nil)
	rt := roundTripper(func(r *http.Request) (*http.Response, error) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Result(), nil
	})
	return &http.Client{Transport: rt}, func() { _ = closeFn() }, nil
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// call posts body to path and returns the decoded answer, or the protocol
// error it carried.
func call(ctx context.Context, c *http.Client, path string, body map[string]any) (map[string]any, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://meshd"+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("meshd admin socket: %w", err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("meshd answered %s without JSON", resp.Status)
	}
	if resp.StatusCode >= 300 {
		var e errs.HTTPBody
		b, _ := json.Marshal(out)
		_ = json.Unmarshal(b, &e)
		return nil, fmt.Errorf("%s (%s)", e.Error, e.Code)
	}
	return out, nil
}

// writeOperatorCreds writes a minted operator credential's creds file
// (0600, never over an existing file) and answers what may be printed:
// everything but the JWT, the seed and the creds themselves.
func writeOperatorCreds(a adminArgs, dataDir string, res map[string]any) (map[string]any, error) {
	key, _ := res["public_key"].(string)
	cf, _ := res["creds"].(string)
	if key == "" || cf == "" {
		return nil, errors.New("meshd answered without a credential")
	}
	path := a.flags["out"]
	if path == "" {
		path = filepath.Join(dataDir, "operator-"+key[:12]+".creds")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the credential was minted but not written (revoke %s with meshd admin operator-credential revoke): %w", key, err)
	}
	if _, err := f.WriteString(cf); err != nil {
		f.Close()
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	return map[string]any{"creds_file": abs, "public_key": key, "name": res["name"], "expires_at": res["expires_at"], "mesh": res["mesh"]}, nil
}
