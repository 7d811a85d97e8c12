package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/tsa"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/fence"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/ratelimit"
)

// noEnv keeps the developer's MESHD_* variables out of the tests.
func noEnv(string) (string, bool) { return "", false }

// syncBuffer is a bytes.Buffer safe to write from run's goroutine while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runUntilReady starts run in the background and waits for meshd.json. The
// returned stop cancels run and returns its error.
func runUntilReady(t *testing.T, dataDir string, extra ...string) (urls map[string]string, stdout *syncBuffer, stop func() error) {
	t.Helper()
	jsonPath := filepath.Join(dataDir, "meshd.json")
	if err := os.Remove(jsonPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{
			"--data-dir", dataDir,
			"--http-addr", "127.0.0.1:0",
			"--nats-addr", "127.0.0.1:0",
			"--ws-addr", "127.0.0.1:0",
			"--log-level", "warn",
		}, extra...), noEnv, stdout, stderr)
	}()
	stop = func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("run did not return after cancel")
			return nil
		}
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(jsonPath)
		if err == nil {
			if err := json.Unmarshal(data, &urls); err != nil {
				t.Fatalf("meshd.json: %v\n%s", err, data)
			}
			return urls, stdout, stop
		}
		select {
		case err := <-done:
			t.Fatalf("run returned before ready: %v\nstderr:\n%s", err, stderr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("meshd.json not written\nstderr:\n%s", stderr)
		}
	}
}

func TestServeWritesURLsAndRestarts(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	var keysFirstRun creds.PublicKeys

	for _, round := range []string{"first start", "restart on the same data dir"} {
		t.Run(round, func(t *testing.T) {
			urls, stdout, stop := runUntilReady(t, dataDir)
			stopped := false
			defer func() {
				if !stopped {
					stop()
				}
			}()

			wantPrefix := map[string]string{
				"control_url":   "http://127.0.0.1:",
				"registrar_url": "http://127.0.0.1:",
				"console_url":   "http://localhost:", // WebAuthn needs a domain
				"mesh_tcp_url":  "nats://127.0.0.1:",
				"mesh_ws_url":   "ws://127.0.0.1:",
			}
			if len(urls) != len(wantPrefix) {
				t.Errorf("meshd.json has %d keys, want %d: %v", len(urls), len(wantPrefix), urls)
			}
			for key, prefix := range wantPrefix {
				got := urls[key]
				if !strings.HasPrefix(got, prefix) {
					t.Errorf("%s = %q, want prefix %q", key, got, prefix)
				}
				if !strings.Contains(stdout.String(), got) {
					t.Errorf("stdout does not show %s %q:\n%s", key, got, stdout)
				}
			}

			// The bus refuses a connection without credentials.
			nc, err := nats.Connect(urls["mesh_tcp_url"], nats.NoReconnect(), nats.Timeout(5*time.Second))
			if err == nil {
				nc.Close()
				t.Fatal("anonymous NATS connection accepted")
			}
			if !errors.Is(err, nats.ErrAuthorization) {
				t.Fatalf("anonymous connect: err = %v, want %v", err, nats.ErrAuthorization)
			}

			resp, err := http.Get(urls["control_url"] + "/healthz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/healthz status = %d", resp.StatusCode)
			}

			stopped = true
			if err := stop(); err != nil {
				t.Fatalf("run after cancel: %v", err)
			}

			// The trust chain on disk is the same across restarts.
			tr, err := creds.Load(filepath.Join(dataDir, "keys"))
			if err != nil {
				t.Fatal(err)
			}
			if keysFirstRun == (creds.PublicKeys{}) {
				keysFirstRun = tr.PublicKeys()
			} else if tr.PublicKeys() != keysFirstRun {
				t.Fatalf("keys changed across restart")
			}
		})
	}
}

// meshd --cluster 3 runs the bus on three servers in one JetStream
// cluster: meshd.json lists every member, each refuses an anonymous
// connection, and the members keep their state under cluster/.
func TestServeOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server cluster")
	}
	dataDir := filepath.Join(t.TempDir(), "mesh")
	urls, stdout, stop := runUntilReady(t, dataDir, "--cluster", "3")
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	members := strings.Split(urls["mesh_tcp_url"], ",")
	if len(members) != 3 || len(strings.Split(urls["mesh_ws_url"], ",")) != 3 {
		t.Fatalf("meshd.json does not list three members: %v", urls)
	}
	if !strings.Contains(stdout.String(), urls["mesh_tcp_url"]) {
		t.Errorf("stdout does not show the members:\n%s", stdout)
	}
	for _, u := range members {
		nc, err := nats.Connect(u, nats.NoReconnect(), nats.Timeout(5*time.Second))
		if err == nil {
			nc.Close()
			t.Fatalf("anonymous connection to %s accepted", u)
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("anonymous connect to %s: %v", u, err)
		}
	}
	resp, err := http.Get(urls["control_url"] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz status = %d", resp.StatusCode)
	}
	for i := range 3 {
		if _, err := os.Stat(filepath.Join(dataDir, "cluster", fmt.Sprintf("meshd-%d", i), "jetstream")); err != nil {
			t.Errorf("member %d keeps no state under cluster/: %v", i, err)
		}
	}
	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestParseServeConfig(t *testing.T) {
	env := func(m map[string]string) lookupEnv {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	// limited is a config with the default limits, changed by f.
	limited := func(c serveConfig, f func(*guest.Limits, *account.Limits)) serveConfig {
		c.GuestLimits, c.AccountLimits = guest.DefaultLimits(), account.DefaultLimits()
		c.Unowned, c.Classes, c.Mailbox = credential.DefaultUnownedLimits(), fence.DefaultClasses(), mailbox.DefaultLimits
		if f != nil {
			f(&c.GuestLimits, &c.AccountLimits)
		}
		return c
	}
	defaults := serveConfig{DataDir: "./.mesh", HTTPAddr: "127.0.0.1:8080", NATSAddr: "127.0.0.1:4222", WSAddr: "127.0.0.1:4443", LogLevel: slog.LevelInfo, MarkupPct: 10}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    serveConfig
		wantErr error
	}{
		{
			name: "defaults",
			want: limited(defaults, nil),
		},
		{
			name: "environment",
			env: map[string]string{"MESHD_DATA_DIR": "/var/mesh", "MESHD_HTTP_ADDR": ":9000", "MESHD_NATS_ADDR": ":5222",
				"MESHD_WS_ADDR": ":5443", "MESHD_LOG_LEVEL": "debug", "CREDITS_PLATFORM_MARKUP_PCT": "15", "MESHD_TRUSTED_PROXY_HOPS": "1"},
			want: limited(serveConfig{DataDir: "/var/mesh", HTTPAddr: ":9000", NATSAddr: ":5222", WSAddr: ":5443", LogLevel: slog.LevelDebug, MarkupPct: 15, TrustedProxyHops: 1}, nil),
		},
		{
			name: "flags win over environment",
			args: []string{"--data-dir", "/flag", "--log-level", "trace", "--trusted-proxy-hops", "2"},
			env:  map[string]string{"MESHD_DATA_DIR": "/env", "MESHD_LOG_LEVEL": "error", "MESHD_TRUSTED_PROXY_HOPS": "1"},
			want: limited(serveConfig{DataDir: "/flag", HTTPAddr: "127.0.0.1:8080", NATSAddr: "127.0.0.1:4222", WSAddr: "127.0.0.1:4443", LogLevel: slog.LevelDebug - 4, MarkupPct: 10, TrustedProxyHops: 2}, nil),
		},
		{
			name: "limits from the environment and flags",
			args: []string{"--limit-guest-live-per-network", "4", "--limit-signup-per-address=2/30m", "--limit-mail-per-recipient", "3/2h"},
			env:  map[string]string{"MESH_LIMIT_GUEST_POOL": "50", "MESH_LIMIT_CONNECT_OVERALL": "9/24h", "MESH_LIMIT_MAIL_PER_RECIPIENT": "1/1h"},
			want: limited(defaults, func(g *guest.Limits, a *account.Limits) {
				g.Pool, g.LivePerNetwork = 50, 4
				a.SignUp.PerAddress = ratelimit.Rate{Max: 2, Window: 30 * time.Minute}
				a.Connect.Overall = ratelimit.Rate{Max: 9, Window: 24 * time.Hour}
				a.MailPerRecipient = ratelimit.Rate{Max: 3, Window: 2 * time.Hour}
			}),
		},
		{
			name: "bus limits from the environment and flags",
			args: []string{"--limit-guest-connections", "5", "--limit-mailbox-bytes", "200MiB", "--limit-unowned-per-key=3/1h"},
			env:  map[string]string{"MESH_LIMIT_UNOWNED_PAYLOAD": "256KiB", "MESH_LIMIT_MAILBOX_PER_AGENT": "50", "MESH_LIMIT_GUEST_SUBSCRIPTIONS": "64"},
			want: func() serveConfig {
				c := limited(defaults, nil)
				c.Classes.Guest.Conns, c.Classes.Guest.Subs, c.Classes.Unowned.Payload = 5, 64, 256<<10
				c.Mailbox.MaxBytes, c.Mailbox.MaxMsgsPerAgent = 200<<20, 50
				c.Unowned.PerKey = ratelimit.Rate{Max: 3, Window: time.Hour}
				return c
			}(),
		},
		{
			name: "the grants' deployer from the environment, a flag winning",
			args: []string{"--grant-deployer", "mesh-deployer@flag-proj.iam.gserviceaccount.com"},
			env:  map[string]string{"MESH_DEPLOYER_SA": "mesh-deployer@env-proj.iam.gserviceaccount.com"},
			want: func() serveConfig {
				c := limited(defaults, nil)
				c.GrantDeployer = "mesh-deployer@flag-proj.iam.gserviceaccount.com"
				return c
			}(),
		},
		{
			name: "the timestamp authorities' file from the environment, a flag winning",
			args: []string{"--timestamp-authorities", "/etc/mesh/tsa.json"},
			env:  map[string]string{"MESHD_TIMESTAMP_AUTHORITIES": "/elsewhere.json"},
			want: func() serveConfig {
				c := limited(defaults, nil)
				c.TimestampAuthorities = "/etc/mesh/tsa.json"
				return c
			}(),
		},
		{name: "size without a number", args: []string{"--limit-mailbox-bytes", "lots"}, wantErr: errUsage},
		{name: "payload too small", env: map[string]string{"MESH_LIMIT_GUEST_PAYLOAD": "10"}, wantErr: errUsage},
		{name: "rate without a window", args: []string{"--limit-guest-per-address", "20"}, wantErr: errUsage},
		{name: "zero rate", env: map[string]string{"MESH_LIMIT_LOGIN_PER_NETWORK": "0/1h"}, wantErr: errUsage},
		{name: "zero live cap", args: []string{"--limit-guest-live-per-address", "0"}, wantErr: errUsage},
		{name: "reserve as big as the pool", args: []string{"--limit-guest-pool", "10", "--limit-guest-reserve", "10"}, wantErr: errUsage},
		{name: "help", args: []string{"--help"}, wantErr: flag.ErrHelp},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: errUsage},
		{name: "bad level", args: []string{"--log-level", "loud"}, wantErr: errUsage},
		{name: "stray argument", args: []string{"extra"}, wantErr: errUsage},
		{name: "empty data dir", args: []string{"--data-dir", ""}, wantErr: errUsage},
		{name: "bad markup", env: map[string]string{"CREDITS_PLATFORM_MARKUP_PCT": "ten"}, wantErr: errUsage},
		{name: "markup above 100", env: map[string]string{"CREDITS_PLATFORM_MARKUP_PCT": "101"}, wantErr: errUsage},
		{name: "cluster", args: []string{"--cluster", "3"}, want: func() serveConfig { c := limited(defaults, nil); c.Cluster = 3; return c }()},
		{name: "cluster from the environment", env: map[string]string{"MESHD_CLUSTER": "5"},
			want: func() serveConfig { c := limited(defaults, nil); c.Cluster = 5; return c }()},
		{name: "cluster of two", args: []string{"--cluster", "2"}, wantErr: errUsage},
		{name: "cluster of nine", args: []string{"--cluster", "9"}, wantErr: errUsage},
		{name: "cluster not a number", args: []string{"--cluster", "three"}, wantErr: errUsage},
		{name: "bad proxy hops", args: []string{"--trusted-proxy-hops", "one"}, wantErr: errUsage},
		{name: "negative proxy hops", env: map[string]string{"MESHD_TRUSTED_PROXY_HOPS": "-1"}, wantErr: errUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			got, err := parseServeConfig(tc.args, env(tc.env), &stdout, &stderr)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v (stderr: %s)", err, &stderr)
			}
			if got != tc.want {
				t.Fatalf("config = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestHelpExplainsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"--help"}, noEnv, &stdout, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{
		"--data-dir", "MESHD_DATA_DIR", "--http-addr", "MESHD_HTTP_ADDR", "--nats-addr", "MESHD_NATS_ADDR",
		"--ws-addr", "MESHD_WS_ADDR", "--log-level", "MESHD_LOG_LEVEL", "--trusted-proxy-hops", "MESHD_TRUSTED_PROXY_HOPS",
		"--grant-deployer", "MESH_DEPLOYER_SA",
		"--cluster", "MESHD_CLUSTER", "--timestamp-authorities", "MESHD_TIMESTAMP_AUTHORITIES",
		"--limit-guest-pool", "MESH_LIMIT_GUEST_POOL", "--limit-guest-per-network", "MESH_LIMIT_GUEST_PER_NETWORK", `default "60/1h"`,
		"--limit-signup-per-address", "MESH_LIMIT_SIGNUP_PER_ADDRESS", `default "10/1h"`, "--limit-mail-per-recipient", "MESH_LIMIT_MAIL_PER_RECIPIENT",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, &stdout)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"frobnicate"}, noEnv, &stdout, &stderr)
	if !errors.Is(err, errUsage) {
		t.Fatalf("err = %v, want usage error", err)
	}
	if !strings.Contains(stderr.String(), "frobnicate") {
		t.Fatalf("stderr does not name the command: %s", &stderr)
	}
}

func TestSplitCommand(t *testing.T) {
	tests := []struct {
		args     []string
		cmd      string
		rest     []string
		anywhere []string // the words parseAnywhere finds in rest, with every flag taking a value but --json
	}{
		{args: nil, cmd: "", rest: nil},
		{args: []string{"--data-dir", "admin"}, cmd: "", rest: []string{"--data-dir", "admin"}},
		{args: []string{"--data-dir", "d", "admin", "account", "create"}, cmd: "admin",
			rest: []string{"--data-dir", "d", "account", "create"}, anywhere: []string{"account", "create"}},
		{args: []string{"--json", "admin", "agent-token", "--name", "x"}, cmd: "admin",
			rest: []string{"--json", "agent-token", "--name", "x"}, anywhere: []string{"agent-token"}},
		{args: []string{"--data-dir=d", "serve", "--log-level", "debug"}, cmd: "serve", rest: []string{"--data-dir=d", "--log-level", "debug"}},
		{args: []string{"-h", "admin"}, cmd: "admin", rest: []string{"-h"}},
		{args: []string{"admin", "account", "--email", "x@y.z", "create", "--json"}, cmd: "admin",
			rest: []string{"account", "--email", "x@y.z", "create", "--json"}, anywhere: []string{"account", "create"}},
		{args: []string{"admin", "agent", "retire", "--reason", "r", "--", "--odd-id"}, cmd: "admin",
			rest: []string{"agent", "retire", "--reason", "r", "--", "--odd-id"}, anywhere: []string{"agent", "retire", "--odd-id"}},
	}
	for _, tc := range tests {
		cmd, rest := splitCommand(tc.args)
		if cmd != tc.cmd || strings.Join(rest, " ") != strings.Join(tc.rest, " ") {
			t.Errorf("splitCommand(%q) = %q, %q; want %q, %q", tc.args, cmd, rest, tc.cmd, tc.rest)
		}
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		for _, f := range []string{"data-dir", "name", "email", "reason", "log-level"} {
			fs.String(f, "", "")
		}
		fs.Bool("json", false, "")
		fs.Bool("h", false, "")
		words, err := parseAnywhere(fs, rest)
		if err != nil || strings.Join(words, " ") != strings.Join(tc.anywhere, " ") {
			t.Errorf("parseAnywhere(%q) = %q, %v; want %q", rest, words, err, tc.anywhere)
		}
	}
}

// --help, -h or the word help anywhere after a command or its words prints
// that command's help to stdout and runs nothing (the data directory here
// does not exist: running anything would fail).
func TestHelpEverywhere(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none")
	tests := []struct {
		args []string
		want []string
		not  []string
	}{
		{args: []string{"--help"}, want: []string{"Commands:", "serve", "admin", "help", "--data-dir", "MESHD_HTTP_ADDR"}},
		{args: []string{"-h"}, want: []string{"admin", "--nats-addr"}},
		{args: []string{"help"}, want: []string{"admin", "--nats-addr"}},
		{args: []string{"serve", "--help"}, want: []string{"--ws-addr"}},
		{args: []string{"serve", "help"}, want: []string{"--ws-addr"}},
		{args: []string{"help", "serve"}, want: []string{"--ws-addr"}},
		{args: []string{"admin", "--help"}, want: []string{"account create", "account disable", "agent-token", "agent retire"}},
		{args: []string{"admin", "-h"}, want: []string{"agent-token"}},
		{args: []string{"admin", "help"}, want: []string{"agent-token"}},
		{args: []string{"help", "admin"}, want: []string{"agent-token"}},
		{args: []string{"--help", "admin"}, want: []string{"agent-token"}},
		{args: []string{"admin", "account", "--help"}, want: []string{"account create", "account disable"}, not: []string{"agent-token"}},
		{args: []string{"admin", "account", "create", "--email", "x@example.org", "--help"}, want: []string{"Usage: meshd admin account create --email E"}},
		{args: []string{"admin", "--data-dir", none, "account", "create", "-h", "--email", "x@example.org"}, want: []string{"Usage: meshd admin account create"}},
		{args: []string{"admin", "account", "disable", "acct_1", "help"}, want: []string{"Usage: meshd admin account disable ID [--reason R]"}},
		{args: []string{"admin", "agent-token", "--account", "acct_1", "--name", "coder", "--help"}, want: []string{"--operator NAME", "claims"}},
		{args: []string{"admin", "agent", "retire", "U123", "--help"}, want: []string{"Usage: meshd admin agent retire ID --reason R"}},
		{args: []string{"help", "admin", "agent", "retire"}, want: []string{"Usage: meshd admin agent retire"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := func(k string) (string, bool) {
				if k == "MESHD_DATA_DIR" {
					return none, true
				}
				return "", false
			}
			err := run(t.Context(), tc.args, env, &stdout, &stderr)
			if !errors.Is(err, flag.ErrHelp) {
				t.Fatalf("err = %v, want flag.ErrHelp (exit 0)\nstderr: %s", err, &stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("help lacks %q:\n%s", w, &stdout)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(stdout.String(), w) {
					t.Errorf("help has %q:\n%s", w, &stdout)
				}
			}
			if stderr.Len() > 0 {
				t.Errorf("stderr: %s", &stderr)
			}
			if _, err := os.Stat(none); err == nil {
				t.Error("help created the data directory")
			}
		})
	}
}

// A second meshd on a data directory in use refuses before it opens
// anything, naming the one that runs there.
func TestSecondMeshdOnADataDirInUse(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	_, _, stop := runUntilReady(t, dataDir)
	defer stop()

	var stdout, stderr bytes.Buffer
	err := run(t.Context(), []string{"--data-dir", dataDir, "--http-addr", "127.0.0.1:0", "--nats-addr", "127.0.0.1:0",
		"--ws-addr", "127.0.0.1:0", "--log-level", "error"}, noEnv, &stdout, &stderr)
	want := fmt.Sprintf("another meshd is running on this data dir, pid %d", os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second meshd: %v, want %q", err, want)
	}
	if stdout.Len() > 0 {
		t.Errorf("the refused meshd printed: %s", &stdout)
	}
}

// --timestamp-authorities names two or more authorities with their roots;
// empty leaves devenv its local test-only ones.
func TestLoadAuthorities(t *testing.T) {
	dir := t.TempDir()
	var cfgs []audit.AuthorityConfig
	for _, name := range []string{"one", "two"} {
		a, err := tsa.New(name)
		if err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, audit.AuthorityConfig{Name: name, URL: "https://" + name + ".example.org", RootPEM: string(a.RootPEM())})
	}
	write := func(name string, v any) string {
		b, _ := json.Marshal(v)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if as, err := loadAuthorities(""); as != nil || err != nil {
		t.Fatalf("none: %v %v", as, err)
	}
	if as, err := loadAuthorities(write("two.json", cfgs)); len(as) != 2 || err != nil {
		t.Fatalf("two: %v %v", as, err)
	}
	for _, path := range []string{write("one.json", cfgs[:1]), write("bad.json", "nope"), filepath.Join(dir, "none.json")} {
		if _, err := loadAuthorities(path); err == nil || !strings.Contains(err.Error(), "--timestamp-authorities") {
			t.Errorf("%s: %v", path, err)
		}
	}
}
