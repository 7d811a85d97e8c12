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
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/devenv"
	"agentmesh.dev/mesh/shared/errs"
)

const adminUsage = `Usage: meshd admin [--data-dir DIR] [--json] COMMAND

Operator commands on the server host. They act on the same store and keys as
the meshd running on DIR (through its admin socket), or on the stopped mesh's
files when none is running.

Commands:
  account create --email E               create an account (or find it)
  account disable ID [--reason R]        disable an account and revoke its credentials
  agent-token --account ID --name NAME   mint a single-use agent key (am_…), valid 7 days
  agent retire ID --reason R             retire an agent and revoke its credentials

Flags:
  --data-dir DIR   the mesh's data directory (env MESHD_DATA_DIR, default ./.mesh)
  --json           print one JSON object instead of text

Example:
  meshd admin account create --email ana@example.org
  meshd admin agent-token --account acct_… --name coder
`

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
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, adminUsage)
			return err
		}
		return usageErr(stderr, err.Error())
	}
	rest := fs.Args()
	var path string
	var body map[string]any
	var show func(map[string]any) string
	sub := flag.NewFlagSet("", flag.ContinueOnError)
	sub.SetOutput(io.Discard)
	cmd := strings.Join(first(rest, 2), " ")
	switch {
	case cmd == "account create":
		email := sub.String("email", "", "")
		if err := sub.Parse(rest[2:]); err != nil || *email == "" || sub.NArg() > 0 {
			return usageErr(stderr, "account create needs --email E")
		}
		path, body = "/admin/accounts", map[string]any{"email": *email}
		show = func(r map[string]any) string {
			if r["created"] == true {
				return fmt.Sprintf("created account %s for %s", r["account_id"], r["email"])
			}
			return fmt.Sprintf("account %s already exists for %s", r["account_id"], r["email"])
		}
	case cmd == "account disable":
		if len(rest) < 3 {
			return usageErr(stderr, "account disable needs the account id")
		}
		reason := sub.String("reason", "", "")
		if err := sub.Parse(rest[3:]); err != nil || sub.NArg() > 0 {
			return usageErr(stderr, "account disable ID [--reason R]")
		}
		path, body = "/admin/accounts/"+rest[2]+"/disable", map[string]any{"reason": *reason}
		show = func(map[string]any) string { return "account " + rest[2] + " disabled; its credentials are revoked" }
	case len(rest) > 0 && rest[0] == "agent-token":
		acct := sub.String("account", "", "")
		name := sub.String("name", "", "")
		if err := sub.Parse(rest[1:]); err != nil || *acct == "" || *name == "" || sub.NArg() > 0 {
			return usageErr(stderr, "agent-token needs --account ID --name NAME")
		}
		path, body = "/admin/agent-tokens", map[string]any{"account": *acct, "name": *name}
		show = func(r map[string]any) string {
			return fmt.Sprintf("%s\n\nSingle use, valid 7 days. On the agent's machine run:\n  %s", r["token"], r["command"])
		}
	case cmd == "agent retire":
		if len(rest) < 3 {
			return usageErr(stderr, "agent retire needs the agent id and --reason R")
		}
		reason := sub.String("reason", "", "")
		if err := sub.Parse(rest[3:]); err != nil || *reason == "" || sub.NArg() > 0 {
			return usageErr(stderr, "agent retire ID --reason R")
		}
		path, body = "/admin/agents/"+rest[2]+"/retire", map[string]any{"reason": *reason}
		show = func(map[string]any) string { return "agent " + rest[2] + " retired; its credentials are revoked" }
	default:
		return usageErr(stderr, fmt.Sprintf("unknown admin command %q", strings.Join(rest, " ")))
	}

	client, done, err := adminClient(dataDir)
	if err != nil {
		return err
	}
	defer done()
	res, err := call(ctx, client, path, body)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintln(stdout, show(res))
	return nil
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

func usageErr(stderr io.Writer, msg string) error {
	fmt.Fprintf(stderr, "meshd admin: %s\n\n%s", msg, adminUsage)
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
