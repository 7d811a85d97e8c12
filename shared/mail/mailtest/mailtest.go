// Package mailtest runs an SMTP server inside a test, on a random loopback
// port, and hands the test every message it receives, decoded.
//
// Point a mail.SMTP sender at Server.Addr() (TLS policy StartTLSNone, or
// StartTLSRequire with WithSTARTTLS and Server.ClientTLSConfig()), then
// Server.Wait for the recipient:
//
//	srv := mailtest.Start(t)
//	sender, _ := mail.NewSMTP(mail.SMTPConfig{Addr: srv.Addr(), From: "mesh@example.com", TLS: mail.StartTLSNone})
//	... code under test sends a login code to alice@example.com ...
//	got, err := srv.Wait(ctx, "alice@example.com")
//	// got.Message.Text holds the decoded body
package mailtest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	netmail "net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"agentmesh.dev/mesh/shared/mail"
)

// Received is one message as the server got it.
type Received struct {
	// From is the envelope sender (MAIL FROM).
	From string
	// To is the envelope recipients (RCPT TO), lower-cased.
	To []string
	// Message is the decoded message: bare To address, decoded subject,
	// decoded text, kind.
	Message mail.Message
	// Header is the parsed header, for assertions on Date, Message-ID, ...
	Header netmail.Header
	// Raw is the message exactly as transmitted in DATA.
	Raw []byte
	// TLS reports whether the session had been upgraded with STARTTLS.
	TLS bool
	// AuthUser is the user that authenticated, if any.
	AuthUser string
}

// Option changes how Start configures the server.
type Option func(*config)

type config struct {
	startTLS       bool
	user, password string
}

// WithSTARTTLS makes the server offer STARTTLS with a fresh self-signed
// certificate for 127.0.0.1 and localhost; clients trust it through
// Server.ClientTLSConfig.
func WithSTARTTLS() Option { return func(c *config) { c.startTLS = true } }

// WithAuth makes the server offer AUTH PLAIN and refuse MAIL until the
// client has authenticated as user with password.
func WithAuth(user, password string) Option {
	return func(c *config) { c.user, c.password = user, password }
}

// Server is a running test SMTP server. It is stopped by the test's cleanup.
type Server struct {
	t    testing.TB
	cfg  config
	addr string
	smtp *smtp.Server
	pool *x509.CertPool

	mu       sync.Mutex
	received []Received
	waited   []bool        // waited[i]: received[i] was returned by Wait
	changed  chan struct{} // closed and replaced on every new message
	closed   bool
}

// Start starts a server on 127.0.0.1:0 and registers its shutdown with
// t.Cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{t: t, changed: make(chan struct{})}
	for _, o := range opts {
		o(&s.cfg)
	}
	srv := smtp.NewServer(backend{s})
	srv.Domain = "mailtest.localhost"
	srv.ReadTimeout = 30 * time.Second
	srv.WriteTimeout = 30 * time.Second
	srv.MaxMessageBytes = 4 << 20
	srv.MaxRecipients = 50
	srv.ErrorLog = testLogger{s}
	if s.cfg.startTLS {
		cert, pool, err := selfSigned()
		if err != nil {
			t.Fatalf("mailtest: certificate: %v", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		s.pool = pool
	} else {
		// Without TLS there is nothing to wait for before AUTH.
		srv.AllowInsecureAuth = true
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("mailtest: listen: %v", err)
	}
	s.addr = l.Addr().String()
	s.smtp = srv
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		_ = srv.Close()
		_ = l.Close() // Serve may not have registered l yet
		<-done
	})
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// ClientTLSConfig returns a TLS config that trusts the server's certificate
// (nil without WithSTARTTLS).
func (s *Server) ClientTLSConfig() *tls.Config {
	if s.pool == nil {
		return nil
	}
	return &tls.Config{RootCAs: s.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// Messages returns every message received so far, oldest first.
func (s *Server) Messages() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Received, len(s.received))
	copy(out, s.received)
	return out
}

// Wait blocks until a message to address arrives (matched on the envelope
// recipients, case-insensitively) and returns it. Each call returns the
// oldest such message that no earlier Wait returned, so two messages to one
// address are returned by two calls, in order.
func (s *Server) Wait(ctx context.Context, to string) (Received, error) {
	want := normalize(to)
	for {
		s.mu.Lock()
		for i, r := range s.received {
			if s.waited[i] {
				continue
			}
			for _, rcpt := range r.To {
				if rcpt == want {
					s.waited[i] = true
					s.mu.Unlock()
					return r, nil
				}
			}
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return Received{}, fmt.Errorf("mailtest: no message to %s: %w", to, context.Cause(ctx))
		case <-changed:
		}
	}
}

func normalize(addr string) string {
	addr = strings.TrimSpace(addr)
	addr = strings.TrimPrefix(addr, "<")
	addr = strings.TrimSuffix(addr, ">")
	return strings.ToLower(addr)
}

func (s *Server) add(r Received) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.received = append(s.received, r)
	s.waited = append(s.waited, false)
	close(s.changed)
	s.changed = make(chan struct{})
}

// testLogger sends the SMTP server's errors to the test log while the test
// runs, and drops them after cleanup (t.Logf would panic then).
type testLogger struct{ s *Server }

func (l testLogger) Printf(format string, v ...any) { l.log(fmt.Sprintf(format, v...)) }
func (l testLogger) Println(v ...any)               { l.log(fmt.Sprintln(v...)) }

func (l testLogger) log(msg string) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if !l.s.closed {
		l.s.t.Logf("mailtest: %s", strings.TrimSpace(msg))
	}
}

type backend struct{ s *Server }

func (b backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{s: b.s, conn: c}, nil
}

type session struct {
	s        *Server
	conn     *smtp.Conn
	authUser string
	from     string
	to       []string
}

var _ smtp.AuthSession = (*session)(nil)

func (se *session) AuthMechanisms() []string {
	if se.s.cfg.user == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (se *session) Auth(mech string) (sasl.Server, error) {
	if se.s.cfg.user == "" || mech != sasl.Plain {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(identity, username, password string) error {
		if identity != "" && identity != username {
			return errors.New("identity differs from user name")
		}
		if username != se.s.cfg.user || password != se.s.cfg.password {
			return errors.New("invalid credentials")
		}
		se.authUser = username
		return nil
	}), nil
}

func (se *session) Mail(from string, _ *smtp.MailOptions) error {
	if se.s.cfg.user != "" && se.authUser == "" {
		return smtp.ErrAuthRequired
	}
	se.from = from
	return nil
}

func (se *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	se.to = append(se.to, normalize(to))
	return nil
}

func (se *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	hdr, err := netmail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: "unparsable message: " + err.Error()}
	}
	msg, err := mail.ParseMessage(raw)
	if err != nil {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 6, 0}, Message: err.Error()}
	}
	_, isTLS := se.conn.TLSConnectionState()
	se.s.add(Received{
		From:     se.from,
		To:       append([]string(nil), se.to...),
		Message:  msg,
		Header:   hdr.Header,
		Raw:      raw,
		TLS:      isTLS,
		AuthUser: se.authUser,
	})
	return nil
}

func (se *session) Reset() {
	se.from = ""
	se.to = nil
}

func (se *session) Logout() error { return nil }

// selfSigned makes a short-lived certificate for the loopback names and a
// pool that trusts it.
func selfSigned() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "mailtest"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}
