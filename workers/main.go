package workers

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
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/cloudlog"
	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/ratelimit"
)

// Options are what a worker binary reads once at start, beside its row's
// configuration.
type Options struct {
	NATSURL     string // --nats-url, MESH_NATS_URL
	CredsFile   string // --creds, MESH_CREDS_FILE: the worker's service credential (creds file)
	ServicesKey string // --services-key, MESH_SERVICES_KEY_FILE: the seed file the answers are signed with
	HealthAddr  string // --health-addr, :$PORT on Cloud Run
	LogLevel    slog.Level
	// SecretsProject (--secrets-project, MESH_SECRETS_PROJECT) reads the
	// credential and the services key from that project's Secret Manager
	// instead of the two files.
	SecretsProject string
	// TrustDir (--trust-dir, MESH_TRUST_DIR; the rooms worker only) is
	// where the trust chain's seed files are, when not in Secret Manager.
	TrustDir string
	// secretManagerHost is MESH_SECRETMANAGER_EMULATOR_HOST: a Secret
	// Manager emulator, for tests of the binaries.
	secretManagerHost string
}

// Main is the whole main of a worker binary: it runs the row named name
// until SIGINT or SIGTERM and exits the process.
func Main(name string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w, err := Lookup(name)
	if err == nil {
		err = Run(ctx, w, os.Args[1:], os.Getenv, os.Stderr)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "%s-worker: %v\n", name, err)
		os.Exit(1)
	}
}

// Run parses args and the environment, then runs one copy of w until ctx
// ends: it connects to the bus with the worker's credential, starts the
// worker with its production configuration (as the flags and variables
// change it), serves GET /healthz, and on ctx's end stops the worker and
// drains the connection.
func Run(ctx context.Context, w Worker, args []string, getenv func(string) string, stderr io.Writer) error {
	opts, cfg, err := parse(w, args, getenv, stderr)
	if err != nil {
		return err
	}
	// Cloud Run reads JSON lines with Cloud Logging's field names.
	log := cloudlog.New(stderr, opts.LogLevel, "").With("worker", w.Name)
	key, credsOpt, err := workerKeys(ctx, w, opts)
	if err != nil {
		return err
	}
	stopCreds, err := roomCredentials(ctx, w, opts, &cfg, log)
	if err != nil {
		return err
	}
	defer stopCreds()
	// Replies arrive under the services' prefix, which no client credential
	// may subscribe (docs/security.md).
	closed := make(chan struct{})
	nc, err := nats.Connect(opts.NATSURL, credsOpt, nats.Name(w.Name+"-worker"), creds.ServiceInbox(),
		nats.DrainTimeout(8*time.Second), nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("disconnected from the bus", "err", err) }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected to the bus") }))
	if err != nil {
		return fmt.Errorf("connect %s: %w", opts.NATSURL, err)
	}
	defer nc.Close()
	s, err := w.Start(ctx, bus.Env{NC: nc, Key: key, Log: log, Now: time.Now}, cfg)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	// A round trip, so the broker holds every subscription of the worker
	// before it reports running and healthy.
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		_ = s.Stop()
		return fmt.Errorf("start: %w", err)
	}
	ln, err := net.Listen("tcp", opts.HealthAddr)
	if err != nil {
		_ = s.Stop()
		return fmt.Errorf("health port: %w", err)
	}
	h := &health{nc: nc}
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("worker running", "nats", opts.NATSURL, "health", ln.Addr().String(), "replicas", bus.Replicas(cfg.Replicas))
	<-ctx.Done()
	// From here the platform must stop sending traffic and may stop waiting.
	h.stopping.Store(true)
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = s.Stop()
	// Drain lets in-flight answers go out before the connection closes;
	// it returns at once, so wait for the close it ends with.
	if derr := nc.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) {
		log.Warn("draining the bus connection", "err", derr)
	}
	select {
	case <-closed:
	case <-shutdown.Done():
		log.Warn("the bus connection did not drain in time")
	}
	_ = srv.Shutdown(shutdown)
	log.Info("worker stopped")
	return err
}

// workerKeys reads the worker's service credential and the services key:
// from Secret Manager when a project is named (the cloud: the secrets
// `meshd cloud init` wrote, read through the API, so no seed file sits on
// a volume whose mode must be right), else from the two files.
func workerKeys(ctx context.Context, w Worker, o Options) (*keys.Agent, nats.Option, error) {
	if o.SecretsProject != "" {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		opts, err := cloudsecrets.EmulatorOptions(o.secretManagerHost)
		if err != nil {
			return nil, nil, err
		}
		wk, err := cloudsecrets.OpenWorker(ctx, o.SecretsProject, w.Name, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("keys: %w", err)
		}
		return wk.Services, wk.Creds.NATSOption(), nil
	}
	key, err := keys.ReadSeedFile[keys.AgentRole](o.ServicesKey)
	if err != nil {
		return nil, nil, fmt.Errorf("services key: %w", err)
	}
	return key, nats.UserCredentials(o.CredsFile), nil
}

// health answers GET /healthz: 200 while the worker runs on a live bus
// connection, 503 while the connection is down (reconnecting) or the worker
// is stopping, so the platform restarts a worker that lost the bus for good
// and sends nothing to one that is going.
type health struct {
	nc       *nats.Conn
	stopping atomic.Bool
}

func (h *health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	connected := h.nc.IsConnected()
	ok := connected && !h.stopping.Load()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = fmt.Fprintf(w, `{"ok":%t,"nats":%t}`+"\n", ok, connected)
}

// parse reads the options and the configuration: the row's production
// configuration, then MESH_* variables, then flags.
func parse(w Worker, args []string, getenv func(string) string, stderr io.Writer) (Options, Config, error) {
	def := func(k, d string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return d
	}
	var o Options
	cfg := w.Production
	knobs := []ratelimit.Knob{replicasKnob(&cfg.Replicas)}
	if w.Knobs != nil {
		knobs = append(knobs, w.Knobs(&cfg)...)
	}
	fs := flag.NewFlagSet(w.Name+"-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.NATSURL, "nats-url", def("MESH_NATS_URL", "nats://127.0.0.1:4222"), "the bus: a server, or every server of a cluster, comma-separated (env MESH_NATS_URL)")
	fs.StringVar(&o.CredsFile, "creds", getenv("MESH_CREDS_FILE"), "the worker's service credential, a NATS creds file (env MESH_CREDS_FILE)")
	fs.StringVar(&o.ServicesKey, "services-key", getenv("MESH_SERVICES_KEY_FILE"), "seed file of the services key answers are signed with (env MESH_SERVICES_KEY_FILE)")
	fs.StringVar(&o.SecretsProject, "secrets-project", getenv("MESH_SECRETS_PROJECT"),
		"read the credential and the services key from this project's Secret Manager instead of files (env MESH_SECRETS_PROJECT)")
	o.secretManagerHost = getenv("MESH_SECRETMANAGER_EMULATOR_HOST")
	trustDirFlag(w, fs, &o, getenv)
	fs.StringVar(&o.HealthAddr, "health-addr", ":"+def("PORT", "8080"), "where GET /healthz answers (env PORT: Cloud Run sets it)")
	level := fs.String("log-level", def("MESH_LOG_LEVEL", "info"), "debug, info, warn or error (env MESH_LOG_LEVEL)")
	for _, k := range knobs {
		fs.Func(k.Flag, k.Help+" (env "+k.Env+", default "+k.Default+")", k.Set)
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s-worker [flags]\n\nRuns the %s bus worker (%s): connects to the mesh, answers its\nsubjects in the queue group every copy shares, and serves GET /healthz.\n\nFlags:\n",
			w.Name, w.Name, w.Description)
		fs.PrintDefaults()
	}
	// Variables first, so a flag given as well wins.
	if err := ratelimit.FromEnv(getenv, knobs...); err != nil {
		return o, cfg, err
	}
	if err := fs.Parse(args); err != nil {
		return o, cfg, err
	}
	if fs.NArg() > 0 {
		return o, cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := o.LogLevel.UnmarshalText([]byte(*level)); err != nil {
		return o, cfg, fmt.Errorf("--log-level: %w", err)
	}
	if o.SecretsProject == "" && (o.CredsFile == "" || o.ServicesKey == "") {
		return o, cfg, errors.New("--secrets-project, or --creds and --services-key, are required (or MESH_SECRETS_PROJECT, or MESH_CREDS_FILE and MESH_SERVICES_KEY_FILE)")
	}
	return o, cfg, nil
}

// replicasKnob is the replica count of the worker's streams and buckets:
// the production cluster's by default, 1 against a single server.
func replicasKnob(n *int) ratelimit.Knob {
	return ratelimit.Knob{Flag: "replicas", Env: "MESH_REPLICAS", Default: strconv.Itoa(bus.Replicas(*n)),
		Help: "replicas of the worker's streams and buckets: 3 on the cloud's cluster, 1 on a single server",
		Set: func(s string) error {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 || v > 5 {
				return fmt.Errorf("want 1 to 5 replicas, not %q", s)
			}
			*n = v
			return nil
		}}
}
