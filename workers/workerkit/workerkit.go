// Package workerkit is the main of every bus worker deployed on its own
// (Cloud Run): it reads the worker's configuration once, connects to the
// bus with the worker's credentials, starts the worker, serves a health
// port, and stops cleanly on SIGTERM. meshd runs the same workers as
// goroutines and does not use this package.
package workerkit

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

// Stopper is a started worker.
type Stopper interface{ Stop() error }

// Starter starts one copy of a worker.
type Starter func(ctx context.Context, env bus.Env) (Stopper, error)

// Config is a worker binary's configuration.
type Config struct {
	NATSURL     string // --nats-url, MESH_NATS_URL
	CredsFile   string // --creds, MESH_CREDS_FILE: the worker's service credential (creds file)
	ServicesKey string // --services-key, MESH_SERVICES_KEY_FILE: the seed file the answers are signed with
	HealthAddr  string // --health-addr, :$PORT on Cloud Run
	LogLevel    slog.Level
}

// Main runs a worker until SIGINT/SIGTERM and exits the process.
func Main(name string, start Starter) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, name, os.Args[1:], os.Getenv, os.Stderr, start); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "%s-worker: %v\n", name, err)
		os.Exit(1)
	}
}

// Run parses args and the environment, then runs the worker until ctx ends.
func Run(ctx context.Context, name string, args []string, getenv func(string) string, stderr io.Writer, start Starter) error {
	cfg, err := parse(name, args, getenv, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).With("worker", name)
	key, err := keys.ReadSeedFile[keys.AgentRole](cfg.ServicesKey)
	if err != nil {
		return fmt.Errorf("services key: %w", err)
	}
	// Replies arrive under the services' prefix, which no client credential
	// may subscribe (docs/security.md).
	nc, err := nats.Connect(cfg.NATSURL, nats.UserCredentials(cfg.CredsFile), nats.Name(name+"-worker"), creds.ServiceInbox(),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("disconnected", "err", err) }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected") }))
	if err != nil {
		return fmt.Errorf("connect %s: %w", cfg.NATSURL, err)
	}
	defer nc.Close()
	w, err := start(ctx, bus.Env{NC: nc, Key: key, Log: log, Now: time.Now})
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.HealthAddr)
	if err != nil {
		_ = w.Stop()
		return fmt.Errorf("health port: %w", err)
	}
	srv := &http.Server{Handler: health(nc), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("worker running", "nats", cfg.NATSURL, "health", ln.Addr().String())
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	err = w.Stop()
	// Drain lets in-flight answers go out before the connection closes.
	_ = nc.Drain()
	log.Info("worker stopped")
	return err
}

// health answers 200 while the bus connection is up, 503 otherwise, so the
// platform restarts a worker that lost the bus for good.
func health(nc *nats.Conn) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !nc.IsConnected() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"ok":false,"nats":false}`)
			return
		}
		_, _ = io.WriteString(w, `{"ok":true,"nats":true}`)
	})
}

func parse(name string, args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	def := func(k, d string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return d
	}
	var c Config
	fs := flag.NewFlagSet(name+"-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.NATSURL, "nats-url", def("MESH_NATS_URL", "nats://127.0.0.1:4222"), "the bus (env MESH_NATS_URL)")
	fs.StringVar(&c.CredsFile, "creds", getenv("MESH_CREDS_FILE"), "the worker's service credential, a NATS creds file (env MESH_CREDS_FILE)")
	fs.StringVar(&c.ServicesKey, "services-key", getenv("MESH_SERVICES_KEY_FILE"), "seed file of the services key answers are signed with (env MESH_SERVICES_KEY_FILE)")
	port := def("PORT", "8080") // Cloud Run sets PORT
	fs.StringVar(&c.HealthAddr, "health-addr", ":"+port, "where GET /healthz answers (env PORT)")
	level := fs.String("log-level", def("MESH_LOG_LEVEL", "info"), "debug, info, warn or error (env MESH_LOG_LEVEL)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s-worker [flags]\n\nRuns the %s bus worker: connects to the mesh, answers its subjects in the\nqueue group every copy shares, and serves GET /healthz.\n\nFlags:\n", name, name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := c.LogLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("--log-level: %w", err)
	}
	if c.CredsFile == "" || c.ServicesKey == "" {
		return c, errors.New("--creds and --services-key are required (or MESH_CREDS_FILE and MESH_SERVICES_KEY_FILE)")
	}
	return c, nil
}
