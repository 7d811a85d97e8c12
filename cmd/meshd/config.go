package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/fence"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/mailbox"
)

// serveConfig is all of meshd's configuration, read once at start.
type serveConfig struct {
	DataDir  string
	HTTPAddr string
	NATSAddr string
	WSAddr   string
	LogLevel slog.Level
	// MarkupPct is CREDITS_PLATFORM_MARKUP_PCT, reported by /v1/capabilities.
	MarkupPct int
	// TrustedProxyHops is how many reverse proxies in front of meshd append
	// to X-Forwarded-For (devenv.Config.TrustedProxyHops).
	TrustedProxyHops int
	// GuestLimits and AccountLimits are the flood limits, one --limit-*
	// flag each (MESH_LIMIT_* variables, the same the Cloud Functions
	// read); devenv.Config's fields of the same names.
	GuestLimits   guest.Limits
	AccountLimits account.Limits
	// Unowned, Classes and Mailbox bound what keys no account owns may mint
	// and do on the bus, and what the offline mailboxes hold
	// (docs/security.md); --limit-* flags and MESH_LIMIT_* variables too.
	Unowned credential.UnownedLimits
	Classes fence.Classes
	Mailbox mailbox.Limits
	// GrantDeployer is the cloud grants' deployer service account
	// (--grant-deployer, MESH_DEPLOYER_SA, as the Cloud Functions read it);
	// empty leaves the grant routes answering 501.
	GrantDeployer string
	// Cluster is --cluster: 0 runs one broker, 3 (or 5, 7) a JetStream
	// cluster of that many in the process (devenv.Config.Cluster).
	Cluster int
	// TimestampAuthorities is --timestamp-authorities: the path of a JSON
	// file naming the audit anchors' authorities, as the cloud's
	// MESH_TIMESTAMP_AUTHORITIES does (docs/audit.md); empty runs two
	// local test-only ones.
	TimestampAuthorities string
}

// setting is one flag with its environment variable and default.
type setting struct {
	flag, env, def, help string
	dst                  *string
}

// parseServeConfig resolves each setting as flag, else environment variable,
// else default. --help prints the usage to stdout and returns flag.ErrHelp.
func parseServeConfig(args []string, env lookupEnv, stdout, stderr io.Writer) (serveConfig, error) {
	var cfg serveConfig
	var level, hops, cluster string
	settings := []setting{
		{"data-dir", "MESHD_DATA_DIR", "./.mesh",
			"directory for all state: keys (mode 0600), account JWTs, JetStream data, meshd.json", &cfg.DataDir},
		{"http-addr", "MESHD_HTTP_ADDR", "127.0.0.1:8080",
			"listen address of the control plane, registrar and console (HTTP)", &cfg.HTTPAddr},
		{"nats-addr", "MESHD_NATS_ADDR", "127.0.0.1:4222",
			"listen address of the bus for NATS clients (TCP)", &cfg.NATSAddr},
		{"ws-addr", "MESHD_WS_ADDR", "127.0.0.1:4443",
			"listen address of the bus for WebSocket clients (plain ws://, no TLS)", &cfg.WSAddr},
		{"log-level", "MESHD_LOG_LEVEL", "info",
			"log level on stderr: trace, debug, info, warn or error", &level},
		{"trusted-proxy-hops", "MESHD_TRUSTED_PROXY_HOPS", "0",
			"reverse proxies in front of meshd that append to X-Forwarded-For; 0 uses the socket address and ignores the header", &hops},
		{"grant-deployer", "MESH_DEPLOYER_SA", "",
			"the deployer service account customers let impersonate theirs (cloud grants, docs/grants.md); Google is reached with this machine's application default credentials; empty turns the grant routes off", &cfg.GrantDeployer},
		{"timestamp-authorities", "MESHD_TIMESTAMP_AUTHORITIES", "",
			"a JSON file naming the RFC 3161 authorities that stamp the daily audit anchors, two or more: [{\"name\", \"url\", \"root_pem\"}] (docs/audit.md); empty runs two local TEST-ONLY authorities, whose stamps prove nothing to anyone else", &cfg.TimestampAuthorities},
		{"cluster", "MESHD_CLUSTER", "0",
			"run the bus on this many nats-servers (3, 5 or 7) forming one JetStream cluster with R3 streams, to try a cluster on one box; member i listens on the NATS and WebSocket ports plus i; 0 runs one server", &cluster},
	}

	// The limits' knobs write into cfg; their flags take a value each,
	// parsed once the command line is read.
	cfg.GuestLimits, cfg.AccountLimits = guest.DefaultLimits(), account.DefaultLimits()
	cfg.Unowned, cfg.Classes, cfg.Mailbox = credential.DefaultUnownedLimits(), fence.DefaultClasses(), mailbox.DefaultLimits
	knobs := slices.Concat(cfg.GuestLimits.Knobs(), cfg.AccountLimits.Knobs(), cfg.Unowned.Knobs(), cfg.Classes.Knobs(), cfg.Mailbox.Knobs())
	knobValues := make([]string, len(knobs))
	var limits []setting
	for i, k := range knobs {
		limits = append(limits, setting{k.Flag, k.Env, k.Default, k.Help, &knobValues[i]})
	}

	fs := flag.NewFlagSet("meshd", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and usage are printed below, to the right stream
	for _, s := range append(settings, limits...) {
		def := s.def
		if v, ok := env(s.env); ok && v != "" {
			def = v
		}
		fs.StringVar(s.dst, s.flag, def, s.help)
	}
	usage := func(w io.Writer) {
		fmt.Fprint(w, "Usage: meshd [serve] [flags]\n"+
			"       meshd admin [flags] COMMAND …   operator commands (meshd admin --help)\n"+
			"       meshd cloud init --project P    a Google Cloud deployment's secrets (meshd cloud --help)\n"+
			"       meshd help [COMMAND]            this help, or a command's\n\n"+
			"Commands:\n"+
			"  serve   run the whole mesh on this machine and print the URLs an adapter needs (the default)\n"+
			"  admin   operator commands on this host: create accounts, mint agent keys, retire agents,\n"+
			"          disable accounts (meshd admin --help lists them)\n"+
			"  cloud   cloud init: add the first version of every secret of a Google Cloud\n"+
			"          deployment in Secret Manager (meshd cloud --help)\n"+
			"  help    show the help of a command, e.g. meshd help admin agent-token\n\n"+
			"Flags of serve (anywhere on the line). Each can also be set with the environment\n"+
			"variable shown; a flag wins. Use 127.0.0.1:0 for any address to pick a free port.\n\n")
		for _, s := range settings {
			fmt.Fprintf(w, "  --%s\n      %s\n      env %s, default %q\n", s.flag, s.help, s.env, s.def)
		}
		fmt.Fprint(w, "\nLimits (docs/security.md lists them all). A rate is <count>/<window>, a sliding\n"+
			"window such as 20/1h; a size is bytes or 64KiB, 1MiB, 1GiB; a client address is an\n"+
			"IPv4 address or an IPv6 /64, its network the /24 or /48. Over a rate the answer is 429\n"+
			"with retry_after_ms. The guest and unowned classes bound what guests and keys no\n"+
			"account owns may do on the bus; the mailbox ones what offline mail may take.\n\n")
		for _, s := range limits {
			fmt.Fprintf(w, "  --%s\n  %-12s %s\n  %-12s env %s, default %q\n", s.flag, "", s.help, "", s.env, s.def)
		}
	}

	words, err := parseAnywhere(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
			return cfg, err
		}
		fmt.Fprintf(stderr, "meshd: %v\n\n", err)
		usage(stderr)
		return cfg, errUsage
	}
	if slices.Contains(words, "help") {
		usage(stdout)
		return cfg, flag.ErrHelp
	}
	if len(words) > 0 {
		fmt.Fprintf(stderr, "meshd: unexpected arguments: %s\n\n", strings.Join(words, " "))
		usage(stderr)
		return cfg, errUsage
	}
	lvl, err := parseLevel(level)
	if err != nil {
		fmt.Fprintf(stderr, "meshd: --log-level: %v\n", err)
		return cfg, errUsage
	}
	cfg.LogLevel = lvl
	if cfg.TrustedProxyHops, err = strconv.Atoi(strings.TrimSpace(hops)); err != nil || cfg.TrustedProxyHops < 0 || cfg.TrustedProxyHops > 16 {
		fmt.Fprintf(stderr, "meshd: --trusted-proxy-hops must be a whole number from 0 to 16, not %q\n", hops)
		return cfg, errUsage
	}
	if cfg.Cluster, err = strconv.Atoi(strings.TrimSpace(cluster)); err != nil || (cfg.Cluster != 0 && cfg.Cluster != 1 &&
		(cfg.Cluster < 3 || cfg.Cluster > 7 || cfg.Cluster%2 == 0)) {
		fmt.Fprintf(stderr, "meshd: --cluster must be 0 (one server) or 3, 5 or 7 servers, not %q\n", cluster)
		return cfg, errUsage
	}
	for i, k := range knobs {
		if err := k.Set(knobValues[i]); err != nil {
			fmt.Fprintf(stderr, "meshd: --%s: %v\n", k.Flag, err)
			return cfg, errUsage
		}
	}
	if err := cfg.GuestLimits.Check(); err != nil {
		fmt.Fprintf(stderr, "meshd: --limit-guest-reserve: %v\n", err)
		return cfg, errUsage
	}
	cfg.MarkupPct = 10
	if v, ok := env("CREDITS_PLATFORM_MARKUP_PCT"); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || commerce.CheckMarkup(n) != nil {
			fmt.Fprintf(stderr, "meshd: CREDITS_PLATFORM_MARKUP_PCT must be a whole percentage from 0 to %d, not %q\n", commerce.MaxMarkupPct, v)
			return cfg, errUsage
		}
		cfg.MarkupPct = n
	}
	if cfg.DataDir == "" {
		fmt.Fprintln(stderr, "meshd: --data-dir must not be empty")
		return cfg, errUsage
	}
	return cfg, nil
}

// parseLevel accepts slog's names (and offsets such as "debug-2") plus
// "trace", which also turns on the broker's protocol trace.
func parseLevel(s string) (slog.Level, error) {
	if strings.EqualFold(s, "trace") {
		return devenv.LevelTrace, nil
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("unknown level %q (want trace, debug, info, warn or error)", s)
	}
	return l, nil
}
