package mail_test

import (
	"context"
	"errors"
	"net"
	netmail "net/mail"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mail/mailtest"
)

func newSMTP(t *testing.T, cfg mail.SMTPConfig) *mail.SMTP {
	t.Helper()
	if cfg.From == "" {
		cfg.From = "Mesh <no-reply@mesh.example>"
	}
	s, err := mail.NewSMTP(cfg)
	if err != nil {
		t.Fatalf("NewSMTP: %v", err)
	}
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSMTPRoundTripUnicode(t *testing.T) {
	srv := mailtest.Start(t)
	s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSNone})
	long := strings.Repeat("é long line that must be soft-wrapped by quoted-printable ", 4)
	want := mail.Message{
		To:      "Zoë Ålander <Zoe@Example.com>",
		Subject: "Ваш код входа — ✓ ready",
		Text: "Hello Zoë,\n\nYour code: 481-227 🔑\n" +
			".\n" + // a lone dot must survive SMTP's end-of-data marker
			"From the mesh (this line starts with From)\n" +
			"trailing spaces   \n" +
			"tab\tand = sign\n" + long,
		Kind: "login-code",
	}
	if err := s.Send(ctxT(t), want); err != nil {
		t.Fatalf("Send: %v", err)
	}
	got, err := srv.Wait(ctxT(t), "zoe@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if got.Message.Subject != want.Subject {
		t.Errorf("subject = %q, want %q", got.Message.Subject, want.Subject)
	}
	if got.Message.Text != want.Text {
		t.Errorf("text =\n%q\nwant\n%q", got.Message.Text, want.Text)
	}
	if got.Message.To != "Zoe@Example.com" || got.Message.Kind != "login-code" {
		t.Errorf("to, kind = %q, %q", got.Message.To, got.Message.Kind)
	}
	if got.From != "no-reply@mesh.example" {
		t.Errorf("envelope from = %q", got.From)
	}
	h := got.Header
	if _, err := h.Date(); err != nil {
		t.Errorf("Date: %v (%q)", err, h.Get("Date"))
	}
	if id := h.Get("Message-ID"); !strings.HasPrefix(id, "<") || !strings.HasSuffix(id, "@mesh.example>") {
		t.Errorf("Message-ID = %q", id)
	}
	for k, v := range map[string]string{
		"MIME-Version":              "1.0",
		"Content-Type":              "text/plain; charset=utf-8",
		"Content-Transfer-Encoding": "quoted-printable",
	} {
		if h.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, h.Get(k), v)
		}
	}
	if strings.Contains(h.Get("Subject"), "Ваш") {
		t.Errorf("non-ASCII subject sent unencoded: %q", h.Get("Subject"))
	}
	if from, err := netmail.ParseAddress(h.Get("From")); err != nil || from.Name != "Mesh" {
		t.Errorf("From = %q (%v)", h.Get("From"), err)
	}
	for i, line := range strings.Split(string(got.Raw), "\r\n") {
		if len(line) > 78 {
			t.Errorf("line %d is %d characters: %q", i, len(line), line)
		}
		for _, c := range []byte(line) {
			if c >= 0x80 {
				t.Fatalf("line %d is not 7-bit: %q", i, line)
			}
		}
	}
	if len(srv.Messages()) != 1 {
		t.Errorf("server has %d messages, want 1", len(srv.Messages()))
	}
}

func TestSMTPWaitReturnsEachMessageOnce(t *testing.T) {
	srv := mailtest.Start(t)
	s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSNone})
	for _, subj := range []string{"first", "second"} {
		if err := s.Send(ctxT(t), mail.Message{To: "bob@example.com", Subject: subj, Text: subj}); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"first", "second"} {
		got, err := srv.Wait(ctxT(t), "BOB@example.com")
		if err != nil {
			t.Fatal(err)
		}
		if got.Message.Subject != want {
			t.Errorf("got %q, want %q", got.Message.Subject, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := srv.Wait(ctx, "bob@example.com"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("third Wait: %v, want deadline exceeded", err)
	}
}

func TestSMTPWaitBlocksUntilArrival(t *testing.T) {
	srv := mailtest.Start(t)
	s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSNone})
	got := make(chan mailtest.Received, 1)
	go func() {
		r, err := srv.Wait(ctxT(t), "carol@example.com")
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	if err := s.Send(ctxT(t), mail.Message{To: "carol@example.com", Subject: "hi", Text: "x"}); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.Message.Subject != "hi" {
		t.Errorf("subject %q", r.Message.Subject)
	}
}

func TestSMTPRefusesHeaderInjection(t *testing.T) {
	srv := mailtest.Start(t)
	s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSNone})
	for name, m := range map[string]mail.Message{
		"CRLF in to":         {To: "a@example.com\r\nBcc: evil@example.com", Subject: "s", Text: "t"},
		"LF in to":           {To: "a@example.com\nBcc: evil@example.com", Subject: "s", Text: "t"},
		"CR in subject":      {To: "a@example.com", Subject: "hi\rBcc: evil@example.com", Text: "t"},
		"CRLF in subject":    {To: "a@example.com", Subject: "hi\r\nBcc: evil@example.com", Text: "t"},
		"LF in subject":      {To: "a@example.com", Subject: "hi\n\nbody", Text: "t"},
		"NUL in subject":     {To: "a@example.com", Subject: "hi\x00", Text: "t"},
		"CRLF in name":       {To: "\"A\r\nBcc: e@example.com\" <a@example.com>", Subject: "s", Text: "t"},
		"two recipients":     {To: "a@example.com, evil@example.com", Subject: "s", Text: "t"},
		"no address":         {To: "not an address", Subject: "s", Text: "t"},
		"empty to":           {To: "", Subject: "s", Text: "t"},
		"CRLF in kind":       {To: "a@example.com", Subject: "s", Text: "t", Kind: "x\r\nBcc: e@example.com"},
		"upper-case kind":    {To: "a@example.com", Subject: "s", Text: "t", Kind: "Login"},
		"invalid UTF-8":      {To: "a@example.com", Subject: "\xff", Text: "t"},
		"subject too long":   {To: "a@example.com", Subject: strings.Repeat("a", 901), Text: "t"},
		"NUL in text":        {To: "a@example.com", Subject: "s", Text: "a\x00b"},
		"invalid UTF-8 text": {To: "a@example.com", Subject: "s", Text: "\xc3"},
	} {
		t.Run(name, func(t *testing.T) {
			err := s.Send(ctxT(t), m)
			if !errors.Is(err, mail.ErrInvalidMessage) {
				t.Fatalf("Send = %v, want ErrInvalidMessage", err)
			}
		})
	}
	if n := len(srv.Messages()); n != 0 {
		t.Errorf("server received %d messages, want 0", n)
	}
}

func TestSMTPTLSPolicies(t *testing.T) {
	msg := mail.Message{To: "dave@example.com", Subject: "s", Text: "secret"}

	t.Run("require refuses a relay without STARTTLS", func(t *testing.T) {
		srv := mailtest.Start(t)
		s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr()}) // zero policy = require
		err := s.Send(ctxT(t), msg)
		if err == nil || !strings.Contains(err.Error(), "STARTTLS") {
			t.Fatalf("Send = %v, want a STARTTLS refusal", err)
		}
		if len(srv.Messages()) != 0 {
			t.Error("message was sent in the clear")
		}
	})
	t.Run("require upgrades", func(t *testing.T) {
		srv := mailtest.Start(t, mailtest.WithSTARTTLS())
		s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSRequire, TLSConfig: srv.ClientTLSConfig()})
		if err := s.Send(ctxT(t), msg); err != nil {
			t.Fatal(err)
		}
		got, err := srv.Wait(ctxT(t), msg.To)
		if err != nil {
			t.Fatal(err)
		}
		if !got.TLS {
			t.Error("session was not upgraded")
		}
	})
	t.Run("require verifies the certificate", func(t *testing.T) {
		srv := mailtest.Start(t, mailtest.WithSTARTTLS())
		s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSRequire}) // system roots
		if err := s.Send(ctxT(t), msg); err == nil {
			t.Fatal("sent over TLS to an untrusted certificate")
		}
		if len(srv.Messages()) != 0 {
			t.Error("message delivered")
		}
	})
	t.Run("opportunistic upgrades when offered", func(t *testing.T) {
		srv := mailtest.Start(t, mailtest.WithSTARTTLS())
		s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSOpportunistic, TLSConfig: srv.ClientTLSConfig()})
		if err := s.Send(ctxT(t), msg); err != nil {
			t.Fatal(err)
		}
		if got, _ := srv.Wait(ctxT(t), msg.To); !got.TLS {
			t.Error("not upgraded")
		}
	})
	t.Run("opportunistic falls back to plain", func(t *testing.T) {
		srv := mailtest.Start(t)
		s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLS: mail.StartTLSOpportunistic})
		if err := s.Send(ctxT(t), msg); err != nil {
			t.Fatal(err)
		}
		if got, _ := srv.Wait(ctxT(t), msg.To); got.TLS {
			t.Error("claims TLS")
		}
	})
}

func TestSMTPAuth(t *testing.T) {
	srv := mailtest.Start(t, mailtest.WithSTARTTLS(), mailtest.WithAuth("relay-user", "relay-pass"))
	msg := mail.Message{To: "erin@example.com", Subject: "s", Text: "t"}

	s := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), Username: "relay-user", Password: "relay-pass", TLSConfig: srv.ClientTLSConfig()})
	if err := s.Send(ctxT(t), msg); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Wait(ctxT(t), msg.To)
	if err != nil {
		t.Fatal(err)
	}
	if got.AuthUser != "relay-user" || !got.TLS {
		t.Errorf("auth user %q, TLS %v", got.AuthUser, got.TLS)
	}

	bad := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), Username: "relay-user", Password: "wrong", TLSConfig: srv.ClientTLSConfig()})
	if err := bad.Send(ctxT(t), msg); err == nil {
		t.Error("wrong password accepted")
	}
	anon := newSMTP(t, mail.SMTPConfig{Addr: srv.Addr(), TLSConfig: srv.ClientTLSConfig()})
	if err := anon.Send(ctxT(t), msg); err == nil {
		t.Error("unauthenticated MAIL accepted")
	}
	if n := len(srv.Messages()); n != 1 {
		t.Errorf("%d messages, want 1", n)
	}
}

func TestSMTPContextCancelUnblocks(t *testing.T) {
	// A relay that accepts the connection and never greets.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	s := newSMTP(t, mail.SMTPConfig{Addr: l.Addr().String(), TLS: mail.StartTLSNone, Timeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = s.Send(ctx, mail.Message{To: "f@example.com", Subject: "s", Text: "t"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send = %v, want deadline exceeded", err)
	}
}

func TestNewSMTPRefusesBadConfig(t *testing.T) {
	for name, cfg := range map[string]mail.SMTPConfig{
		"no port":          {Addr: "smtp.example.com", From: "a@example.com"},
		"bad from":         {Addr: "smtp.example.com:587", From: "nobody"},
		"CRLF in from":     {Addr: "smtp.example.com:587", From: "a@example.com\r\nBcc: b@example.com"},
		"unknown policy":   {Addr: "smtp.example.com:587", From: "a@example.com", TLS: "sometimes"},
		"password no user": {Addr: "smtp.example.com:587", From: "a@example.com", Password: "p"},
		"negative timeout": {Addr: "smtp.example.com:587", From: "a@example.com", Timeout: -time.Second},
	} {
		if _, err := mail.NewSMTP(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
