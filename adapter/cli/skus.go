package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/registry"
)

func init() {
	register(&command{name: "skus", usage: "<handle-or-agent-id> [--json] [--accept-new-binding]",
		summary: "list what an agent sells: its SKUs, prices and digests",
		help: `Reads the agent's registration (a handle is resolved and pinned as for
"send") and prints each SKU it publishes: its id, what it covers, the price
in words, who bills for it, and its current digest (an agreement binds to
that digest; any change to the SKU changes it, and an agreement to an older
one no longer covers). An agent without SKUs sells nothing: every offering
is free. --json prints [{sku, price, digest, covers, provider}], the price,
covers and provider as published.

What this adapter's own agent sells is set with "start --skus <file>" (or
"up --skus <file>"): a JSON array of SKUs (docs/commerce.md), checked before
it is saved in the state directory and published with every registration.
"--skus none" stops selling.

Example:
  mesh-adapter skus caselaw.ana@example.org
  mesh-adapter skus UDXQ... --json`,
		run: runSKUs})
}

func runSKUs(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("skus", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	accept := fs.Bool("accept-new-binding", false, "read even though the handle's agent changed since it was pinned, and pin the new one")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("give one agent: skus <handle-or-agent-id>")
	}
	var rec map[string]any
	err = e.call(control.Request{Op: "registration", To: pos[0], AcceptNewBinding: *accept, RegistrarURL: e.RegistrarURL}, &rec, time.Minute)
	if errors.Is(err, control.ErrNotRunning) {
		dir, derr := e.openState()
		if derr != nil {
			return derr
		}
		rec, err = daemon.Registration(ctx, daemon.Config{Dir: dir, ControlURL: e.ControlURL, RegistrarURL: e.RegistrarURL, Out: e.Stderr, Log: e.logger()},
			pos[0], daemon.SendOptions{AcceptNewBinding: *accept, RegistrarURL: e.RegistrarURL})
	}
	if err != nil {
		return err
	}
	var skus []commerce.SKU
	if v := rec["skus"]; v != nil {
		skus, err = commerce.SKUsFromValue(v)
	}
	if err != nil {
		return fmt.Errorf("%s publishes SKUs this adapter cannot read: %w", pos[0], err)
	}
	if *asJSON {
		return printJSON(e.Stdout, skuRows(skus))
	}
	printSKUs(e.Stdout, rec, skus)
	return nil
}

// skuRow is one SKU as `skus --json` prints it: the storefront's advert
// (sku, price, digest) with what it covers and who bills for it.
type skuRow struct {
	commerce.Advert
	Covers   any `json:"covers"`
	Provider any `json:"provider"`
}

func skuRows(skus []commerce.SKU) []skuRow {
	rows := make([]skuRow, 0, len(skus))
	for _, s := range skus {
		rows = append(rows, skuRow{Advert: s.Advert(), Covers: s.Value()["covers"], Provider: s.Value()["provider"]})
	}
	return rows
}

func printSKUs(w io.Writer, rec map[string]any, skus []commerce.SKU) {
	id, _ := rec["id"].(string)
	name, _ := rec["name"].(string)
	fmt.Fprintf(w, "%s (%s), owner %s\n", name, id, ownerOf(rec))
	if len(skus) == 0 {
		fmt.Fprintln(w, "publishes no SKUs: every offering is free")
		return
	}
	for _, s := range skus {
		fmt.Fprintf(w, "\n%s\n", s.ID)
		fmt.Fprintf(w, "  covers    %s\n", coversInWords(s.Covers))
		fmt.Fprintf(w, "  price     %s\n", PriceInWords(s.Price))
		fmt.Fprintf(w, "  provider  %s\n", providerInWords(s.Provider))
		fmt.Fprintf(w, "  digest    %s\n", s.Digest())
	}
}

// ownerOf is the record's owner now in words: registry.OwnerOf's, or "none"
// when the agent has none (a guest, an agent that is its own node, or an
// expired owner attestation).
func ownerOf(rec map[string]any) string {
	if o := registry.OwnerOf(rec, time.Now()); o != "" {
		return o
	}
	return "none"
}

func coversInWords(c commerce.Covers) string {
	if c.Agent {
		return "the whole agent (every offering no other SKU names)"
	}
	if len(c.Offerings) == 1 {
		return "offering " + c.Offerings[0]
	}
	return "offerings " + strings.Join(c.Offerings, ", ")
}

func providerInWords(p commerce.Provider) string {
	s := p.ID
	if p.ID == commerce.ProviderInternal {
		s = "internal (this mesh's credits)"
	}
	if p.TermsURL != "" {
		s += ", terms " + p.TermsURL
	}
	if p.CheckoutURL != "" {
		s += ", checkout " + p.CheckoutURL
	}
	return s
}

// PriceInWords says a price in one line, amounts in micro-units of the
// currency: "1,500 µXCR per 1000 tokens_out, first 10,000 a day included".
func PriceInWords(p commerce.Price) string {
	money := func(n int64) string { return thousands(n) + " µ" + p.Currency }
	per := func() string {
		if p.Per > 1 {
			return strconv.FormatInt(p.Per, 10) + " " + p.Meter
		}
		return p.Meter
	}
	var s string
	switch p.Model {
	case commerce.ModelFree:
		return "free"
	case commerce.ModelFlat:
		s = money(p.AmountMicro) + " per request"
	case commerce.ModelPerUnit:
		s = money(p.AmountMicro) + " per " + per()
	case commerce.ModelPackage:
		s = fmt.Sprintf("%s per package of %s %s, counted %s", money(p.AmountMicro), thousands(p.Size), p.Meter, periodly(p.Period))
	case commerce.ModelTiered:
		bands := make([]string, 0, len(p.Tiers))
		for _, t := range p.Tiers {
			if t.UpTo == 0 {
				bands = append(bands, "then "+money(t.AmountMicro))
			} else {
				bands = append(bands, "up to "+thousands(t.UpTo)+" at "+money(t.AmountMicro))
			}
		}
		s = fmt.Sprintf("tiered per %s, counted %s: %s", per(), periodly(p.Period), strings.Join(bands, ", "))
	default:
		return p.Model
	}
	if p.Included != nil {
		s += fmt.Sprintf(", first %s a %s included", thousands(p.Included.Quantity), p.Included.Period)
	}
	return s
}

func periodly(period string) string {
	if period == commerce.PeriodMonth {
		return "per UTC month"
	}
	return "per UTC day"
}

// thousands writes n with commas between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// saveSKUsFlag is `start --skus <file>` and `up --skus <file>`: "" leaves
// skus.json as it is, "none" removes it, anything else is a file of SKUs
// checked and saved in its place.
func saveSKUsFlag(dir *state.Dir, path string) error {
	switch path {
	case "":
		return nil
	case "none":
		return dir.SaveSKUs(nil)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--skus: %w", err)
	}
	skus, err := state.ParseSKUs(data, path)
	if err != nil {
		return err
	}
	for _, s := range skus {
		for _, o := range s.Covers.Offerings {
			if o != daemon.Offering {
				return fmt.Errorf("%s: SKU %s covers offering %q; this adapter's agent offers only %q (or cover the whole agent: {\"agent\": true})", path, s.ID, o, daemon.Offering)
			}
		}
	}
	return dir.SaveSKUs(data)
}
