// Package cli is the mesh-adapter command line (spec §4.2): a small table
// of commands over the adapter's packages. main only calls Main.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"agentmesh.dev/mesh/adapter/state"
)

// Env is what a command runs with: its streams, the process environment
// and the global options.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string

	StateDir     string
	ControlURL   string
	RegistrarURL string
}

// command is one subcommand.
type command struct {
	name    string
	usage   string // the argument synopsis
	summary string // one line for the command list
	help    string // the full help: what it does, then an example
	run     func(ctx context.Context, e *Env, args []string) error
}

var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

// Exit statuses; docs/adapter.md lists them. Every failure prints one line
// on stderr.
const (
	exitFailure = 1 // the command failed: nothing was sent, or the adapter could not start
	exitUsage   = 2 // a mistake in the command line
	// send: the message was delivered and is held for a person (inbox
	// mode) or by the mesh; the answer comes later, to `inbox`.
	exitQueued = 3
	// send: the recipient answered with an error (a refusal, a failed run).
	exitAnswerError = 4
	// send: nothing answered within --wait.
	exitNoAnswer = 5
)

// exitError carries an exit status other than 1.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError is a mistake in the command line: the command's usage is
// printed with it, and the exit status is 2.
func usageError(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// Main runs the command line and returns the exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	e := &Env{Stdin: stdin, Stdout: stdout, Stderr: stderr, Getenv: getenv}
	fs := flag.NewFlagSet("mesh-adapter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.globalFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout)
			return 0
		}
		fmt.Fprintf(stderr, "mesh-adapter: %v\n\n", err)
		printUsage(stderr)
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 {
		printUsage(stderr)
		return 2
	}
	name := rest[0]
	if name == "help" {
		if len(rest) > 1 && !hasHelpFlag(rest[1:2]) {
			c, ok := commands[rest[1]]
			if !ok {
				fmt.Fprintf(stderr, "mesh-adapter help: unknown command %q\n\n", rest[1])
				printUsage(stderr)
				return 2
			}
			printHelp(stdout, c)
			return 0
		}
		printUsage(stdout)
		return 0
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "mesh-adapter: unknown command %q\n\n", name)
		printUsage(stderr)
		return 2
	}
	if hasHelpFlag(rest[1:]) {
		printHelp(stdout, c)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, e, rest[1:])
	if err == nil {
		return 0
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	fmt.Fprintf(stderr, "mesh-adapter %s: %v\n", name, err)
	if code == exitUsage {
		fmt.Fprintf(stderr, "usage: mesh-adapter %s %s\n(see `mesh-adapter help %s`)\n", c.name, c.usage, c.name)
	}
	return code
}

// hasHelpFlag finds -h/--help (also written with a value, --help=true)
// before a "--": help is printed instead of running the command, wherever
// on the line it is asked for.
func hasHelpFlag(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "-h", "--h", "-help", "--help":
			return true
		}
	}
	return false
}

// globalFlags are accepted before the command and after it. Their
// defaults are what is already set (by flags before the command), then the
// environment: binding them again for a command must not undo those.
func (e *Env) globalFlags(fs *flag.FlagSet) {
	home := firstNonEmpty(e.StateDir, e.Getenv("MESH_ADAPTER_HOME"))
	if home == "" {
		if h, err := os.UserHomeDir(); err == nil {
			home = filepath.Join(h, ".mesh", "adapter")
		}
	}
	fs.StringVar(&e.StateDir, "state-dir", home, "the adapter's state directory (env MESH_ADAPTER_HOME; default ~/.mesh/adapter)")
	fs.StringVar(&e.ControlURL, "control-url", firstNonEmpty(e.ControlURL, e.Getenv("MESH_CONTROL_URL")), "the mesh control plane (env MESH_CONTROL_URL; default: the one saved by `up`)")
	fs.StringVar(&e.RegistrarURL, "registrar-url", firstNonEmpty(e.RegistrarURL, e.Getenv("MESH_REGISTRAR_URL")), "the handle registrar (env MESH_REGISTRAR_URL; default: the one saved by `up`)")
}

// parse parses a command's flags, which may appear before, between and
// after its positional arguments (`reply 3 --refuse-budget 2h`), and
// returns the positional ones. Everything after a "--" is positional, so
// a text that starts with "-" can still be sent.
func (e *Env) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	e.globalFlags(fs)
	fs.SetOutput(io.Discard)
	var tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return append(pos, tail...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// openState opens the state directory named by the global flags.
func (e *Env) openState() (*state.Dir, error) {
	if e.StateDir == "" {
		return nil, errors.New("no state directory: set --state-dir or MESH_ADAPTER_HOME")
	}
	return state.Open(e.StateDir)
}

// identity opens the state directory and decodes its agent's keys.
func (e *Env) identity() (*state.Dir, state.Identity, state.Keys, error) {
	dir, err := e.openState()
	if err != nil {
		return nil, state.Identity{}, state.Keys{}, err
	}
	id, err := dir.Identity()
	if err != nil {
		return nil, state.Identity{}, state.Keys{}, err
	}
	ks, err := id.Keys()
	if err != nil {
		return nil, state.Identity{}, state.Keys{}, err
	}
	return dir, id, ks, nil
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `mesh-adapter gives an agent an inbound address on the mesh.

Usage:
  mesh-adapter [global flags] <command> [arguments]

Commands:
`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `
Global flags (also accepted after the command):
  --state-dir DIR       the adapter's state (env MESH_ADAPTER_HOME; default ~/.mesh/adapter)
  --control-url URL     the mesh control plane (env MESH_CONTROL_URL)
  --registrar-url URL   the handle registrar (env MESH_REGISTRAR_URL)

First steps on one machine (meshd prints its URLs when it starts):
  mesh-adapter --control-url http://127.0.0.1:8080 up am_...   # redeem an agent key, start the inbox
  mesh-adapter send <agent-id> "hello" --wait 30              # from another terminal

Run "mesh-adapter help <command>" for a command's details and an example.
`)
}

func printHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "usage: mesh-adapter %s %s\n\n%s\n", c.name, c.usage, strings.TrimSpace(c.help))
}
