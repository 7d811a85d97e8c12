package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

// DocumentVersion is the version of the anchor document, its v member.
const DocumentVersion = 1

// Document is the public anchor of a date: the Merkle root of every chain
// head as it stood at the end of the date (00:00 UTC the next day), the
// mesh's name, how many heads and how many rows the root commits to, and no
// agent or account identifier. Its canonical JSON (JCS) is the published
// document; the SHA-256 of those bytes is what the authorities stamp, so
// `openssl ts -verify -data document.json` checks a token against it.
type Document struct {
	V    int    `json:"v"`
	Date string `json:"date"`
	// Root is the RFC 6962 root over the heads (merkle.go), hex.
	Root string `json:"root"`
	Mesh string `json:"mesh"`
	// Heads is the number of chains (leaves); Rows the sum of their
	// lengths.
	Heads uint64 `json:"heads"`
	Rows  int64  `json:"rows"`
}

// Canonical is the document's canonical JSON, the bytes published and
// stamped.
func (d *Document) Canonical() ([]byte, error) {
	return protocol.Canonical(d)
}

// Digest is the SHA-256 of the canonical document.
func (d *Document) Digest() ([]byte, error) {
	b, err := d.Canonical()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// newDocument is the document of a date's tree.
func newDocument(mesh, date string, t *Tree) Document {
	var rows int64
	for _, h := range t.Heads() {
		rows += h.Seq
	}
	return Document{V: DocumentVersion, Date: date, Root: t.Root(), Mesh: mesh, Heads: t.Size(), Rows: rows}
}

// Anchor statuses.
const (
	// StatusPending: made, its stamps not yet asked for (or the job that
	// asked stopped before it could record the answers).
	StatusPending = "pending"
	// StatusStamped: every configured authority stamped the document.
	StatusStamped = "stamped"
	// StatusFailed: some authority did not stamp it; a later run asks
	// again those that did not.
	StatusFailed = "failed"
)

// Anchor is the record of a date's anchor: the document, its stamps and
// where the job stands. It is a control-plane document (AnchorStore).
type Anchor struct {
	Date     string   `json:"date"`
	Document Document `json:"document"`
	// DocumentSHA256 is the hex SHA-256 of the canonical document.
	DocumentSHA256 string  `json:"document_sha256"`
	Status         string  `json:"status"`
	Stamps         []Stamp `json:"stamps"`
	// ProofsRecorded says the heads' inclusion proofs are in the chains
	// (Chains.RecordProofs), where exports find them.
	ProofsRecorded bool `json:"proofs_recorded"`
	// ProofsNote says why the proofs could not be recorded, if so.
	ProofsNote string `json:"proofs_note,omitempty"`
	// Attempts counts the stamping attempts; LastError says why the last
	// one left the anchor failed.
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// stampOf returns the anchor's stamp by the named authority.
func (a *Anchor) stampOf(name string) *Stamp {
	for i := range a.Stamps {
		if a.Stamps[i].Authority == name {
			return &a.Stamps[i]
		}
	}
	return nil
}

// Ledger is what the anchorer needs of the chains (Chains implements it).
type Ledger interface {
	// HeadsAt returns every chain's head as it stood at t, sorted by
	// agent; the same answer every time for a t in the past.
	HeadsAt(ctx context.Context, t time.Time) ([]Head, error)
	// RecordProofs keeps the heads' inclusion proofs, idempotently.
	RecordProofs(ctx context.Context, proofs []Proof) error
}

// MinAuthorities is how many timestamp authorities an anchorer needs: one
// authority that lies or disappears must not be the whole proof.
const MinAuthorities = 2

// AnchorerConfig is what NewAnchorer needs.
type AnchorerConfig struct {
	// Mesh is the mesh's name, written in every document.
	Mesh   string
	Ledger Ledger
	Store  AnchorStore
	// Authorities stamp every anchor; at least MinAuthorities, with
	// distinct names.
	Authorities []Authority
	// Client makes the timestamp requests (http.DefaultClient when nil).
	Client *http.Client
	// RequestTimeout bounds one authority's answer (30 s when 0).
	RequestTimeout time.Duration
	// Grace is how long after midnight UTC a date is anchored, so rows
	// in flight at midnight are stored first (1 minute when 0).
	Grace time.Duration
	// CatchUp is how many past dates a run looks at: missed dates are
	// anchored and unstamped ones asked again (7 when 0).
	CatchUp int
	Now     func() time.Time
	Log     *slog.Logger
}

// Anchorer makes the daily anchors. Every step is idempotent and every
// write a compare-and-set or a create, so several copies may run it at
// once and a run stopped anywhere is finished by the next.
type Anchorer struct {
	cfg     AnchorerConfig
	stamper *Stamper
}

// NewAnchorer checks the configuration.
func NewAnchorer(cfg AnchorerConfig) (*Anchorer, error) {
	switch {
	case cfg.Mesh == "":
		return nil, errors.New("audit: the anchorer needs the mesh's name")
	case cfg.Ledger == nil || cfg.Store == nil:
		return nil, errors.New("audit: the anchorer needs the chains and an anchor store")
	case len(cfg.Authorities) < MinAuthorities:
		return nil, fmt.Errorf("audit: anchors need at least %d timestamp authorities; %d configured", MinAuthorities, len(cfg.Authorities))
	}
	seen := map[string]bool{}
	for _, a := range cfg.Authorities {
		if a.Name == "" || a.URL == "" || a.Root == nil {
			return nil, fmt.Errorf("audit: timestamp authority %q needs a name, a URL and a root", a.Name)
		}
		if seen[a.Name] {
			return nil, fmt.Errorf("audit: timestamp authority %q is configured twice", a.Name)
		}
		seen[a.Name] = true
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = time.Minute
	}
	if cfg.CatchUp <= 0 {
		cfg.CatchUp = 7
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Anchorer{cfg: cfg, stamper: &Stamper{Client: cfg.Client}}, nil
}

// ErrTooEarly is returned for a date whose day has not ended (plus the
// grace) yet.
var ErrTooEarly = errors.New("audit: that date has not ended yet")

// ParseDate reads a date (YYYY-MM-DD) as midnight UTC.
func ParseDate(date string) (time.Time, error) {
	d, err := time.Parse(time.DateOnly, date)
	if err != nil || d.Format(time.DateOnly) != date {
		return time.Time{}, fmt.Errorf("audit: %q is not a date (YYYY-MM-DD)", date)
	}
	return d, nil
}

// Anchor makes the anchor of date, or finishes it: the heads at the end of
// the date, their root, the document and its record, the heads' proofs,
// then a stamp from every configured authority that has not stamped it
// yet. Run twice, it makes one anchor; an anchor already stamped is
// returned as it is.
func (a *Anchorer) Anchor(ctx context.Context, date string) (*Anchor, error) {
	day, err := ParseDate(date)
	if err != nil {
		return nil, err
	}
	end := day.AddDate(0, 0, 1)
	if a.cfg.Now().Before(end.Add(a.cfg.Grace)) {
		return nil, fmt.Errorf("%w: %s", ErrTooEarly, date)
	}
	rec, err := a.cfg.Store.Get(ctx, date)
	var tree *Tree
	if errors.Is(err, ErrNoAnchor) {
		if tree, err = a.tree(ctx, end); err != nil {
			return nil, err
		}
		if rec, err = a.create(ctx, date, tree); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if !rec.ProofsRecorded {
		if rec, err = a.recordProofs(ctx, rec, tree, end); err != nil {
			return nil, err
		}
	}
	if rec.Status == StatusStamped {
		// Final: an authority added to the configuration later does not
		// reopen it.
		return rec, nil
	}
	return a.stamp(ctx, rec)
}

// tree is the Merkle tree of the heads at end.
func (a *Anchorer) tree(ctx context.Context, end time.Time) (*Tree, error) {
	heads, err := a.cfg.Ledger.HeadsAt(ctx, end)
	if err != nil {
		return nil, err
	}
	return NewTree(heads)
}

// create stores the new anchor of date; when another run created it first,
// that one is returned.
func (a *Anchorer) create(ctx context.Context, date string, tree *Tree) (*Anchor, error) {
	doc := newDocument(a.cfg.Mesh, date, tree)
	digest, err := doc.Digest()
	if err != nil {
		return nil, err
	}
	now := a.cfg.Now().UTC()
	rec := &Anchor{Date: date, Document: doc, DocumentSHA256: hex.EncodeToString(digest), Status: StatusPending,
		CreatedAt: now, UpdatedAt: now}
	err = a.cfg.Store.Create(ctx, rec)
	if errors.Is(err, ErrAnchorExists) {
		return a.cfg.Store.Get(ctx, date)
	}
	if err != nil {
		return nil, err
	}
	a.cfg.Log.Info("audit anchor made", "date", date, "root", doc.Root, "heads", doc.Heads, "rows", doc.Rows)
	return rec, nil
}

// recordProofs records the inclusion proofs of the anchor's heads (tree,
// computed again when nil) and marks the anchor so. When the heads at the
// date's end are no longer what the root commits to (an account closed in
// between purged chains), the proofs cannot be made: the anchor says so
// and stands without them.
func (a *Anchorer) recordProofs(ctx context.Context, rec *Anchor, tree *Tree, end time.Time) (*Anchor, error) {
	var err error
	if tree == nil {
		if tree, err = a.tree(ctx, end); err != nil {
			return nil, err
		}
	}
	note := ""
	if tree.Root() == rec.Document.Root {
		proofs, err := tree.Proofs(rec.Date)
		if err != nil {
			return nil, err
		}
		if err := a.cfg.Ledger.RecordProofs(ctx, proofs); err != nil {
			return nil, err
		}
	} else {
		note = "the chains changed after the anchor was made (an account was closed), so its inclusion proofs could not be recorded"
		a.cfg.Log.Warn("audit anchor without proofs", "date", rec.Date, "reason", note)
	}
	return a.cfg.Store.Update(ctx, rec.Date, func(r *Anchor) error {
		if r.ProofsRecorded {
			return ErrNoChange
		}
		r.ProofsRecorded, r.ProofsNote = true, note
		r.UpdatedAt = a.cfg.Now().UTC()
		return nil
	})
}

// missing lists the configured authorities that have not stamped rec.
func (a *Anchorer) missing(rec *Anchor) []Authority {
	var out []Authority
	for _, au := range a.cfg.Authorities {
		if rec.stampOf(au.Name) == nil {
			out = append(out, au)
		}
	}
	return out
}

// stamp asks every configured authority that has not stamped rec for a
// token, and records the answers: stamped when every authority has
// stamped, failed with the reasons otherwise.
func (a *Anchorer) stamp(ctx context.Context, rec *Anchor) (*Anchor, error) {
	digest, err := rec.Document.Digest()
	if err != nil {
		return nil, err
	}
	if hex.EncodeToString(digest) != rec.DocumentSHA256 {
		return nil, fmt.Errorf("audit: the anchor of %s does not hash to its recorded document hash", rec.Date)
	}
	day, err := ParseDate(rec.Date)
	if err != nil {
		return nil, err
	}
	end := day.AddDate(0, 0, 1)
	var got []Stamp
	var failures []string
	for _, au := range a.missing(rec) {
		rctx, cancel := context.WithTimeout(ctx, a.cfg.RequestTimeout)
		st, err := a.stamper.Request(rctx, au, digest)
		cancel()
		if err == nil && st.Time.Before(end) {
			// A verifier refuses it (Check): the authority's clock says the
			// date had not ended. Asked again on the next run.
			err = fmt.Errorf("timestamp authority %s stamped the anchor of %s at %s, before the date ended", au.Name, rec.Date, st.Time.Format(time.RFC3339))
		}
		if err != nil {
			a.cfg.Log.Warn("audit anchor not stamped", "date", rec.Date, "authority", au.Name, "err", err)
			failures = append(failures, err.Error())
			continue
		}
		got = append(got, st)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	out, err := a.cfg.Store.Update(ctx, rec.Date, func(r *Anchor) error {
		if r.Status == StatusStamped {
			return ErrNoChange // another run finished it
		}
		for _, st := range got {
			if r.stampOf(st.Authority) == nil {
				r.Stamps = append(r.Stamps, st)
			}
		}
		r.Attempts++
		if len(a.missing(r)) == 0 {
			r.Status, r.LastError = StatusStamped, ""
		} else {
			r.Status = StatusFailed
			r.LastError = strings.Join(failures, "; ")
			if r.LastError == "" {
				r.LastError = "some authorities have not stamped it yet"
			}
		}
		r.UpdatedAt = a.cfg.Now().UTC()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out.Status == StatusStamped {
		a.cfg.Log.Info("audit anchor stamped", "date", out.Date, "authorities", len(out.Stamps))
	}
	return out, nil
}

// Run is the scheduled job (a route row: Cloud Scheduler in the cloud, a
// ticker in meshd). It anchors the last date that has ended (plus the
// grace); within the CatchUp dates before it, it anchors the dates missed
// since the oldest anchor it finds there (a mesh with no anchor yet starts
// with the last date alone), and finishes the anchors not yet stamped,
// asking again only the authorities that have not stamped them. It returns
// the anchors it worked on, oldest first.
func (a *Anchorer) Run(ctx context.Context) ([]*Anchor, error) {
	now := a.cfg.Now().UTC()
	last := now.Add(-a.cfg.Grace).Truncate(24*time.Hour).AddDate(0, 0, -1)
	lastDate := last.Format(time.DateOnly)
	recent, err := a.cfg.Store.List(ctx, a.cfg.CatchUp)
	if err != nil {
		return nil, err
	}
	byDate := map[string]*Anchor{}
	oldest := ""
	for _, r := range recent {
		byDate[r.Date] = r
		if oldest == "" || r.Date < oldest {
			oldest = r.Date
		}
	}
	var out []*Anchor
	var errs []error
	for i := a.cfg.CatchUp - 1; i >= 0; i-- {
		date := last.AddDate(0, 0, -i).Format(time.DateOnly)
		r, seen := byDate[date]
		switch {
		case seen && r.ProofsRecorded && r.Status == StatusStamped:
			continue
		case !seen && oldest == "" && date != lastDate:
			continue // a new mesh: nothing to catch up
		case !seen && oldest != "" && date < oldest:
			continue // before this mesh's anchors in the window
		}
		rec, err := a.Anchor(ctx, date)
		if err != nil {
			errs = append(errs, fmt.Errorf("anchor of %s: %w", date, err))
			continue
		}
		out = append(out, rec)
	}
	return out, errors.Join(errs...)
}
