// Package passkey registers WebAuthn credentials (passkeys) for an account
// and verifies assertions made with them, on github.com/go-webauthn/webauthn.
//
// The Service holds no state between calls. Each ceremony has two halves:
//
//	options, session, err := svc.BeginRegistration(user) // or BeginLogin
//	// send options to the browser; persist session with the account (the
//	// control-plane store), keyed so that the finishing request finds it
//	cred, err := svc.FinishRegistration(user, session, browserJSON) // or FinishLogin
//
// options is the JSON the browser needs: {"publicKey": {...}}, with every
// binary field base64url-encoded, ready for
// PublicKeyCredential.parseCreationOptionsFromJSON(options.publicKey) (or
// parseRequestOptionsFromJSON for a login). The browser's answer is the
// credential's toJSON() output, passed to Finish as bytes.
//
// session is opaque JSON bytes. The caller must treat it as single use:
// read and delete it in one store transaction before calling Finish. This
// package cannot tell a replayed (session, response) pair from the first
// use when the authenticator does not count signatures (most synced
// passkeys report 0 every time); see FinishLogin. Sessions also expire after
// Config.Timeout, enforced here.
//
// Defaults chosen for the console, sent in every ceremony:
//
//   - residentKey "preferred": the authenticator creates a discoverable
//     credential (a passkey) where it can, and a plain one where it cannot;
//   - userVerification "preferred": the browser asks for a PIN or biometric
//     when the authenticator has one, but an assertion without the UV flag is
//     still accepted; callers that need verification read
//     Credential.Flags.UserVerified of the credential FinishLogin returns;
//   - attestation "none": the mesh does not ask who made the authenticator,
//     so no attestation certificates are collected or trusted;
//   - excludeCredentials lists the user's existing credentials, so one
//     authenticator is not registered twice for the same account;
//   - the timeout is Config.Timeout (default DefaultTimeout), both as the
//     browser's hint and as the server-side expiry of the session.
package passkey

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"
)

// DefaultTimeout is how long a ceremony may take when Config.Timeout is 0.
const DefaultTimeout = 5 * time.Minute

// FreshFor is how long a successful assertion counts as "fresh" for
// operations that need the user to have just proven presence with a passkey
// (adding a credential, minting an agent key, ...).
const FreshFor = 5 * time.Minute

// maxClockSkew is how far in the future an assertion time may lie and still
// count as fresh, to absorb clock differences between instances that record
// and check it.
const maxClockSkew = 30 * time.Second

// IsFresh reports whether an assertion made at assertedAt is still fresh at
// now: at most FreshFor old, and not more than a few seconds in the future.
// A zero assertedAt (never asserted) is never fresh.
func IsFresh(assertedAt, now time.Time) bool {
	if assertedAt.IsZero() {
		return false
	}
	age := now.Sub(assertedAt)
	return age <= FreshFor && age >= -maxClockSkew
}

// Config says who the relying party is.
type Config struct {
	// RPID is the relying party id: the console's registrable domain, e.g.
	// "mesh.example.com" (or "localhost" on one machine).
	RPID string
	// RPDisplayName is shown by the browser, e.g. "Agent Mesh".
	RPDisplayName string
	// RPOrigins are the exact origins the browser may report, e.g.
	// "https://mesh.example.com" or "http://localhost:8080".
	RPOrigins []string
	// Timeout bounds a ceremony; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Service runs WebAuthn ceremonies. It is safe for concurrent use.
type Service struct {
	wa *webauthn.WebAuthn
}

// Errors a caller can tell apart with errors.Is.
var (
	// ErrRejected wraps every refusal of a browser's response: bad
	// signature, wrong challenge, origin or relying party, unknown or
	// foreign credential, expired session, suspected clone. The caller
	// answers "unauthorized" and does not retry with the same session. The
	// error text carries the library's detail (expected challenge, origin)
	// for the server log; do not show it to the browser.
	ErrRejected = errors.New("passkey: response rejected")
	// ErrCloneSuspected is wrapped (together with ErrRejected) when an
	// assertion's signature counter did not advance past the stored one:
	// the credential's private key may exist twice, or the response is a
	// replay. The stored credential is left as it was.
	ErrCloneSuspected = errors.New("passkey: signature counter did not advance; possible cloned authenticator or replay")
	// ErrInvalidSession means the session bytes are not a session of the
	// expected ceremony (corrupt, or a registration session used to log in).
	ErrInvalidSession = errors.New("passkey: invalid session")
	// ErrNoCredentials means a login was begun for a user without passkeys.
	ErrNoCredentials = errors.New("passkey: user has no credentials")
	// ErrInvalidUser means the user's id is empty or longer than 64 bytes.
	ErrInvalidUser = errors.New("passkey: invalid user")
)

// New checks cfg and returns a service.
func New(cfg Config) (*Service, error) {
	if cfg.RPID == "" || cfg.RPDisplayName == "" || len(cfg.RPOrigins) == 0 {
		return nil, errors.New("passkey: config needs RPID, RPDisplayName and at least one origin")
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("passkey: negative timeout")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	// Round down to whole milliseconds, the unit the browser gets, but
	// keep at least one (the library replaces 0 with its own default).
	cfg.Timeout = max(cfg.Timeout.Truncate(time.Millisecond), time.Millisecond)
	timeout := webauthn.TimeoutConfig{Enforce: true, Timeout: cfg.Timeout, TimeoutUVD: cfg.Timeout}
	wa, err := webauthn.New(&webauthn.Config{
		RPID:                  cfg.RPID,
		RPDisplayName:         cfg.RPDisplayName,
		RPOrigins:             append([]string(nil), cfg.RPOrigins...),
		AttestationPreference: protocol.PreferNoAttestation,
		AuthenticatorSelection: protocol.AuthenticatorSelection{
			ResidentKey:      protocol.ResidentKeyRequirementPreferred,
			UserVerification: protocol.VerificationPreferred,
		},
		Timeouts: webauthn.TimeoutsConfig{Login: timeout, Registration: timeout},
	})
	if err != nil {
		return nil, fmt.Errorf("passkey: %w", err)
	}
	return &Service{wa: wa}, nil
}

// Credential is a stored passkey: the credential record of the WebAuthn
// specification (id, COSE public key, signature counter, transports, flags,
// AAGUID, attestation data). Its JSON form is that of webauthn.Credential,
// suitable for storing as is; fields are reached directly, e.g.
// c.ID, c.Authenticator.SignCount, c.Flags.UserVerified.
type Credential webauthn.Credential

// IDString is the credential id in base64url without padding, the form the
// browser uses, suitable as a store key.
func (c Credential) IDString() string {
	return base64.RawURLEncoding.EncodeToString(c.ID)
}

// User is the account a ceremony is for. It implements webauthn.User.
type User struct {
	// ID is the WebAuthn user handle: 1 to 64 bytes, random, never shown,
	// and never an email address. It must stay the same for the account.
	ID []byte `json:"id"`
	// Name is the account's human-readable identifier, e.g. an email.
	Name string `json:"name"`
	// DisplayName is what the browser shows, e.g. the person's name.
	DisplayName string `json:"displayName"`
	// Credentials are the account's registered passkeys.
	Credentials []Credential `json:"credentials,omitempty"`
}

var _ webauthn.User = User{}

// WebAuthnID implements webauthn.User.
func (u User) WebAuthnID() []byte { return u.ID }

// WebAuthnName implements webauthn.User.
func (u User) WebAuthnName() string { return u.Name }

// WebAuthnDisplayName implements webauthn.User.
func (u User) WebAuthnDisplayName() string { return u.DisplayName }

// WebAuthnCredentials implements webauthn.User.
func (u User) WebAuthnCredentials() []webauthn.Credential {
	out := make([]webauthn.Credential, len(u.Credentials))
	for i, c := range u.Credentials {
		out[i] = webauthn.Credential(c)
	}
	return out
}

func (u User) check() error {
	if n := len(u.ID); n < protocol.MinimumUserHandleLength || n > protocol.MaximumUserHandleLength {
		return fmt.Errorf("%w: id is %d bytes, want 1 to 64", ErrInvalidUser, n)
	}
	return nil
}

// Ceremony names inside a session, so that one kind cannot finish the other.
const (
	ceremonyRegistration = "registration"
	ceremonyLogin        = "login"
)

// session is what the caller stores between Begin and Finish.
type session struct {
	Ceremony string               `json:"ceremony"`
	Data     webauthn.SessionData `json:"data"`
}

func encodeSession(ceremony string, data *webauthn.SessionData) ([]byte, error) {
	b, err := json.Marshal(session{Ceremony: ceremony, Data: *data})
	if err != nil {
		return nil, fmt.Errorf("passkey: encode session: %w", err)
	}
	return b, nil
}

func decodeSession(ceremony string, b []byte) (webauthn.SessionData, error) {
	var s session
	if err := json.Unmarshal(b, &s); err != nil {
		return webauthn.SessionData{}, fmt.Errorf("%w: %v", ErrInvalidSession, err)
	}
	if s.Ceremony != ceremony {
		return webauthn.SessionData{}, fmt.Errorf("%w: a %q session, want %q", ErrInvalidSession, s.Ceremony, ceremony)
	}
	if s.Data.Challenge == "" {
		return webauthn.SessionData{}, fmt.Errorf("%w: no challenge", ErrInvalidSession)
	}
	return s.Data, nil
}

// rejected wraps a library error in ErrRejected, keeping the library's
// developer detail, which its Error method leaves out.
func rejected(err error) error {
	var perr *protocol.Error
	if errors.As(err, &perr) && perr.DevInfo != "" {
		return fmt.Errorf("%w: %w (%s)", ErrRejected, err, perr.DevInfo)
	}
	return fmt.Errorf("%w: %w", ErrRejected, err)
}

// BeginRegistration starts adding a passkey to user. It returns the options
// for the browser's navigator.credentials.create and the session to keep
// until FinishRegistration.
func (s *Service) BeginRegistration(user User) (options json.RawMessage, session []byte, err error) {
	if err := user.check(); err != nil {
		return nil, nil, err
	}
	exclude := make([]protocol.CredentialDescriptor, len(user.Credentials))
	for i, c := range user.Credentials {
		wc := webauthn.Credential(c)
		exclude[i] = wc.Descriptor()
	}
	creation, data, err := s.wa.BeginRegistration(user, webauthn.WithExclusions(exclude))
	if err != nil {
		return nil, nil, fmt.Errorf("passkey: begin registration: %w", err)
	}
	if options, err = json.Marshal(creation); err != nil {
		return nil, nil, fmt.Errorf("passkey: encode options: %w", err)
	}
	if session, err = encodeSession(ceremonyRegistration, data); err != nil {
		return nil, nil, err
	}
	return options, session, nil
}

// FinishRegistration verifies the browser's answer (the JSON of the
// PublicKeyCredential that navigator.credentials.create returned) against the
// session from BeginRegistration and returns the new credential, for the
// caller to add to the user's credentials. A credential id the user already
// has is rejected.
func (s *Service) FinishRegistration(user User, session []byte, response []byte) (Credential, error) {
	if err := user.check(); err != nil {
		return Credential{}, err
	}
	data, err := decodeSession(ceremonyRegistration, session)
	if err != nil {
		return Credential{}, err
	}
	parsed, err := protocol.ParseCredentialCreationResponseBody(bytes.NewReader(response))
	if err != nil {
		return Credential{}, rejected(err)
	}
	cred, err := s.wa.CreateCredential(user, data, parsed)
	if err != nil {
		return Credential{}, rejected(err)
	}
	for _, c := range user.Credentials {
		if bytes.Equal(c.ID, cred.ID) {
			return Credential{}, fmt.Errorf("%w: credential is already registered", ErrRejected)
		}
	}
	return Credential(*cred), nil
}

// BeginLogin starts an assertion by one of user's passkeys. It returns the
// options for the browser's navigator.credentials.get (allowCredentials lists
// the user's credentials) and the session to keep until FinishLogin.
func (s *Service) BeginLogin(user User) (options json.RawMessage, session []byte, err error) {
	if err := user.check(); err != nil {
		return nil, nil, err
	}
	if len(user.Credentials) == 0 {
		return nil, nil, ErrNoCredentials
	}
	assertion, data, err := s.wa.BeginLogin(user)
	if err != nil {
		return nil, nil, fmt.Errorf("passkey: begin login: %w", err)
	}
	if options, err = json.Marshal(assertion); err != nil {
		return nil, nil, fmt.Errorf("passkey: encode options: %w", err)
	}
	if session, err = encodeSession(ceremonyLogin, data); err != nil {
		return nil, nil, err
	}
	return options, session, nil
}

// FinishLogin verifies the browser's answer (the JSON of the
// PublicKeyCredential that navigator.credentials.get returned) against the
// session from BeginLogin and the user's credentials. It returns the
// credential that signed, updated: the caller stores it in place of the old
// one (its signature counter and backup state change).
//
// Signature counters (clone detection): when the stored counter or the
// asserted one is non-zero, the asserted counter must be greater than the
// stored one. If it is not, the authenticator may have been cloned or the
// response replayed, and FinishLogin refuses with ErrCloneSuspected (and
// ErrRejected); the stored credential should be left unchanged, and may be
// flagged for the account's owner. Authenticators that always report 0 (most
// synced passkeys) are accepted every time; for them, replay protection is
// the single-use session alone.
func (s *Service) FinishLogin(user User, session []byte, response []byte) (Credential, error) {
	if err := user.check(); err != nil {
		return Credential{}, err
	}
	if len(user.Credentials) == 0 {
		return Credential{}, ErrNoCredentials
	}
	data, err := decodeSession(ceremonyLogin, session)
	if err != nil {
		return Credential{}, err
	}
	parsed, err := protocol.ParseCredentialRequestResponseBody(bytes.NewReader(response))
	if err != nil {
		return Credential{}, rejected(err)
	}
	var stored uint32
	for _, c := range user.Credentials {
		if bytes.Equal(c.ID, parsed.RawID) {
			stored = c.Authenticator.SignCount
		}
	}
	cred, err := s.wa.ValidateLogin(user, data, parsed)
	if err != nil {
		return Credential{}, rejected(err)
	}
	// §7.2 step 17, decided here rather than left as the library's warning.
	if asserted := parsed.Response.AuthenticatorData.Counter; (asserted != 0 || stored != 0) && asserted <= stored {
		return Credential{}, fmt.Errorf("%w: %w (stored %d, asserted %d)", ErrRejected, ErrCloneSuspected, stored, asserted)
	}
	return Credential(*cred), nil
}
