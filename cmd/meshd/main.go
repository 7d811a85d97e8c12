// Command meshd runs the whole mesh on one machine: the embedded NATS broker
// (operator mode, JetStream, WebSocket), the HTTP control plane, the registrar
// and the console, with all state under one data directory.
//
//	meshd [serve] [flags]
//	meshd admin [flags] COMMAND …
//	meshd cloud init --project P [flags]
//	meshd help [COMMAND]
//
// Every flag can also be set through an environment variable (flags win).
// The logic lives in devenv; this file reads configuration and wires
// signals, output and meshd.json.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal a second one ends the process at once.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "meshd: %v\n", err)
		os.Exit(1)
	}
}

// errUsage means the command line was wrong; the message is already printed.
var errUsage = errors.New("usage error")

// lookupEnv is os.LookupEnv; tests pass their own so the caller's environment
// never leaks into them.
type lookupEnv func(string) (string, bool)

// run dispatches a subcommand: "serve", which is also what runs when
// there is no command word; "admin" runs operator commands against a data
// directory; "cloud" prepares a Google Cloud deployment's secrets; "help"
// shows the help of any of them. The command word may come after flags,
// and flags may follow it.
func run(ctx context.Context, args []string, env lookupEnv, stdout, stderr io.Writer) error {
	cmd, args := splitCommand(args)
	switch cmd {
	case "", "serve":
		cfg, err := parseServeConfig(args, env, stdout, stderr)
		if err != nil {
			return err
		}
		return serve(ctx, cfg, stdout, stderr)
	case "admin":
		return admin(ctx, args, env, stdout, stderr)
	case "cloud":
		return cloud(ctx, args, stdout, stderr, adcSecrets)
	case "help":
		// meshd help [COMMAND [WORDS…]] is COMMAND WORDS… --help.
		sub, rest := splitCommand(args)
		var again []string
		if sub != "" && sub != "help" {
			again = append(again, sub)
		}
		return run(ctx, append(append(again, rest...), "--help"), env, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "meshd: unknown command %q (commands: serve, admin, cloud, help; meshd --help explains them)\n", cmd)
		return errUsage
	}
}
