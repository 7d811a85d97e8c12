package mail

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	netmail "net/mail"
	"net/smtp"
	"time"
)

// TLSPolicy says how the SMTP sender protects its connection to the relay.
type TLSPolicy string

const (
	// StartTLSRequire upgrades the connection with STARTTLS and refuses to
	// send if the relay does not offer it. The zero policy means this one.
	StartTLSRequire TLSPolicy = "require"
	// StartTLSOpportunistic upgrades when the relay offers STARTTLS and
	// sends in the clear otherwise. Credentials are still never sent in
	// the clear except to a loopback relay (net/smtp's PlainAuth rule).
	StartTLSOpportunistic TLSPolicy = "opportunistic"
	// StartTLSNone never upgrades. For a relay on the same host only.
	StartTLSNone TLSPolicy = "none"
	// ImplicitTLS speaks TLS from the first byte ("SMTPS", usually port 465).
	ImplicitTLS TLSPolicy = "implicit"
)

// DefaultSMTPTimeout bounds one whole delivery (dial, TLS, commands, data)
// when SMTPConfig.Timeout is zero.
const DefaultSMTPTimeout = 30 * time.Second

// SMTPConfig configures the production sender. It is part of the binary's
// one config struct; nothing here reads the environment.
type SMTPConfig struct {
	// Addr is the relay's host:port, e.g. "smtp.example.com:587".
	Addr string
	// From is the sender, "Mesh <no-reply@example.com>" or a bare address.
	// Its domain also names the Message-ID.
	From string
	// Username and Password authenticate with AUTH PLAIN when Username is
	// set. They are only sent over TLS, or to a relay on a loopback address.
	Username string
	Password string
	// TLS is the connection policy; "" means StartTLSRequire.
	TLS TLSPolicy
	// Timeout bounds one delivery; 0 means DefaultSMTPTimeout. A context
	// deadline that comes sooner wins.
	Timeout time.Duration
	// HelloName is the name given in EHLO; "" means "localhost".
	HelloName string
	// TLSConfig, when set, is used (cloned) for STARTTLS and implicit TLS,
	// e.g. to trust a test server's certificate. ServerName defaults to
	// Addr's host. nil means the system roots.
	TLSConfig *tls.Config
	// Now is the clock for the Date header; nil means time.Now.
	Now func() time.Time
}

// SMTP sends each message over its own connection to a relay. It is safe for
// concurrent use.
type SMTP struct {
	cfg  SMTPConfig
	host string
	from *netmail.Address
}

var _ Sender = (*SMTP)(nil)

// NewSMTP checks cfg and returns a sender. It does not connect.
func NewSMTP(cfg SMTPConfig) (*SMTP, error) {
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("mail: SMTP address %q is not host:port", cfg.Addr)
	}
	from, err := parseAddress("sender", cfg.From)
	if err != nil {
		return nil, fmt.Errorf("mail: SMTP config: %w", err)
	}
	switch cfg.TLS {
	case "":
		cfg.TLS = StartTLSRequire
	case StartTLSRequire, StartTLSOpportunistic, StartTLSNone, ImplicitTLS:
	default:
		return nil, fmt.Errorf("mail: SMTP TLS policy %q is not require, opportunistic, none or implicit", cfg.TLS)
	}
	if cfg.Password != "" && cfg.Username == "" {
		return nil, errors.New("mail: SMTP config has a password but no username")
	}
	if hasControl(cfg.HelloName) {
		return nil, errors.New("mail: SMTP hello name holds a control character")
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("mail: SMTP timeout is negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultSMTPTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &SMTP{cfg: cfg, host: host, from: from}, nil
}

func (s *SMTP) tlsConfig() *tls.Config {
	var c *tls.Config
	if s.cfg.TLSConfig != nil {
		c = s.cfg.TLSConfig.Clone()
	} else {
		c = &tls.Config{}
	}
	if c.ServerName == "" {
		c.ServerName = s.host
	}
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// Send renders m and delivers it to the relay for m.To. An invalid message
// fails with an error wrapping ErrInvalidMessage before any connection is
// made. Errors never include the message text.
func (s *SMTP) Send(ctx context.Context, m Message) error {
	c, err := check(m)
	if err != nil {
		return err
	}
	id, err := newMessageID(s.from)
	if err != nil {
		return err
	}
	raw, err := render(s.from, c, s.cfg.Now(), id, quotedPrintable)
	if err != nil {
		return err
	}
	if err := s.deliver(ctx, c.to.Address, raw); err != nil {
		cause := context.Cause(ctx)
		if d, ok := ctx.Deadline(); cause == nil && ok && !time.Now().Before(d) {
			cause = context.DeadlineExceeded // the connection's deadline, taken from ctx, fired first
		}
		if cause != nil {
			return fmt.Errorf("mail: send to %s via %s: %w (%v)", c.to.Address, s.cfg.Addr, cause, err)
		}
		return fmt.Errorf("mail: send to %s via %s: %w", c.to.Address, s.cfg.Addr, err)
	}
	return nil
}

func (s *SMTP) deliver(ctx context.Context, rcpt string, raw []byte) error {
	deadline := time.Now().Add(s.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	dialer := net.Dialer{Deadline: deadline}
	conn, err := dialer.DialContext(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	// Cancelling ctx unblocks whatever read or write is in flight.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if s.cfg.TLS == ImplicitTLS {
		tc := tls.Client(conn, s.tlsConfig())
		if err := tc.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("TLS handshake: %w", err)
		}
		conn = tc
	}
	// net/smtp notices a *tls.Conn and lets PlainAuth send credentials.
	client, err := smtp.NewClient(conn, s.host)
	if err != nil {
		return err
	}
	defer client.Close()
	if s.cfg.HelloName != "" {
		if err := client.Hello(s.cfg.HelloName); err != nil {
			return err
		}
	}
	switch s.cfg.TLS {
	case StartTLSRequire, StartTLSOpportunistic:
		if ok, _ := client.Extension("STARTTLS"); ok {
			if err := client.StartTLS(s.tlsConfig()); err != nil {
				return fmt.Errorf("STARTTLS: %w", err)
			}
		} else if s.cfg.TLS == StartTLSRequire {
			return errors.New("the relay does not offer STARTTLS and the TLS policy is require")
		}
	}
	if s.cfg.Username != "" {
		if err := client.Auth(smtp.PlainAuth("", s.cfg.Username, s.cfg.Password, s.host)); err != nil {
			return fmt.Errorf("AUTH: %w", err)
		}
	}
	if err := client.Mail(s.from.Address); err != nil {
		return err
	}
	if err := client.Rcpt(rcpt); err != nil {
		return err
	}
	w, err := client.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(raw); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	// The relay has accepted the message; a failed QUIT changes nothing.
	_ = client.Quit()
	return nil
}
