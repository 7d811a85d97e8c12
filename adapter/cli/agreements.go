package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/protocol"
)

func init() {
	register(&command{name: "agree", usage: "<seller-handle-or-agent-id> <sku> [--digest <d>] [--expires <instant-or-duration>] | revoke <seller> <sku>",
		summary: "agree to a seller's paid SKU with the owner key, or revoke it",
		help: `Reads the seller's current terms for <sku> from the registry and prints
them (the price in words and the terms digest) before anything is signed;
then signs an agreement to exactly those terms with the owner key in the
state directory, and files it with the mesh's agreements service. From
then on the seller's node admits this account's agents to the offerings
the SKU covers, until the agreement expires, is revoked, or the seller
changes the terms (a new price makes every agreement to the old one stale
at once: agree again). It prints what was agreed.

--digest <d>    agree only to the terms with digest d (the sku_digest of an
                AGREEMENT_REQUIRED refusal, which send prints in the
                command it suggests): when the seller's current terms
                differ, nothing is signed and agree says what they are now
--expires <t>   the agreement ends at t: an RFC 3339 instant, or a
                duration from now such as 720h or 30d (default: none)

"agree revoke <seller> <sku>" signs and files a revocation: the agreement
stops covering from now on; usage before stays as it was rated.

Example:
  mesh-adapter agree helper.ana@example.org summarize-flat --expires 30d
  mesh-adapter agree UAB3...XYZ summarize-flat --digest sha256:...
  mesh-adapter agree revoke UAB3...XYZ summarize-flat`,
		run: runAgree})
	register(&command{name: "agreements", usage: "[--json]",
		summary: "list the agreements the owner key has signed",
		help: `Lists the agreements of this account's owner key, each with its state:
active (it covers the seller's current terms), stale (the seller changed
the terms since: agree again), expired, or revoked.

Example:
  mesh-adapter agreements
  mesh-adapter agreements --json`,
		run: runAgreements})
}

// parseExpires reads --expires: an RFC 3339 instant, or a duration from
// now (Go's form, plus whole days such as 30d).
func parseExpires(s string, now time.Time) (string, error) {
	if s == "" {
		return "", nil
	}
	if t, err := protocol.ParseTime(s); err == nil {
		if !t.After(now) {
			return "", usageError("--expires %s is not in the future", s)
		}
		return protocol.FormatTime(t), nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 3650 {
			return "", usageError("--expires %q: a number of days is 1 to 3650", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d <= 0 {
			return "", usageError("--expires %q is neither an RFC 3339 instant nor a positive duration (720h, 30d)", s)
		}
	}
	return protocol.FormatTime(now.Add(d)), nil
}

// commerceDo runs an agreements command through the running adapter, or
// with the agent brought up for it.
func (e *Env) commerceDo(ctx context.Context, cmd daemon.CommerceCommand, out any) error {
	b, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	err = e.call(control.Request{Op: "commerce", Commerce: b, RegistrarURL: e.RegistrarURL}, out, time.Minute)
	if !errors.Is(err, control.ErrNotRunning) {
		return err
	}
	dir, err := e.openState()
	if err != nil {
		return err
	}
	res, err := daemon.Commerce(ctx, daemon.Config{Dir: dir, ControlURL: e.ControlURL, RegistrarURL: e.RegistrarURL, Out: e.Stderr, Log: e.logger()},
		cmd, daemon.SendOptions{RegistrarURL: e.RegistrarURL})
	if err != nil {
		return err
	}
	rb, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return json.Unmarshal(rb, out)
}

func runAgree(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("agree", flag.ContinueOnError)
	expires := fs.String("expires", "", "when the agreement ends: an RFC 3339 instant or a duration (720h, 30d)")
	digest := fs.String("digest", "", "agree only to the terms with this digest (the refusal's sku_digest)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	cmd := daemon.CommerceCommand{Verb: daemon.CommerceAgree}
	if len(pos) > 0 && pos[0] == "revoke" {
		cmd.Verb, pos = daemon.CommerceRevoke, pos[1:]
		if *expires != "" || *digest != "" {
			return usageError("--expires and --digest apply to an agreement, not to a revocation")
		}
	}
	if len(pos) != 2 {
		return usageError("give the seller (a handle or agent id) and the SKU id")
	}
	cmd.Seller, cmd.SKU = pos[0], pos[1]
	if !commerce.ValidSKUID(cmd.SKU) {
		return usageError("%q is not a SKU id ([a-z0-9-]{1,64}): the seller's storefront lists them", cmd.SKU)
	}
	if cmd.Expires, err = parseExpires(*expires, time.Now()); err != nil {
		return err
	}
	if cmd.Verb == daemon.CommerceAgree {
		// The terms are shown before anything is signed, and what is
		// signed is what was shown: the agreement is pinned to the quoted
		// digest (or refused, when --digest names other terms).
		var quote daemon.Agreed
		if err := e.commerceDo(ctx, daemon.CommerceCommand{Verb: daemon.CommerceQuote, Seller: cmd.Seller, SKU: cmd.SKU}, &quote); err != nil {
			return err
		}
		if *digest != "" && *digest != quote.Digest {
			return fmt.Errorf("the seller's terms changed: %s of agent %s is now %s, terms digest %s, not %s; nothing was signed. Review the new terms, then run `mesh-adapter agree %s %s --digest %s`",
				quote.SKU, quote.Seller, PriceText(quote.Price), quote.Digest, *digest, cmd.Seller, cmd.SKU, quote.Digest)
		}
		if !*asJSON {
			fmt.Fprintf(e.Stdout, "terms: %s of agent %s at %s, terms digest %s\n", quote.SKU, quote.Seller, PriceText(quote.Price), quote.Digest)
		}
		cmd.Digest = quote.Digest
	}
	var res daemon.Agreed
	if err := e.commerceDo(ctx, cmd, &res); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.Stdout, res)
	}
	printAgreed(e.Stdout, cmd.Verb, res)
	return nil
}

// printAgreed says what was agreed to, or revoked.
func printAgreed(w io.Writer, verb string, r daemon.Agreed) {
	if verb == daemon.CommerceRevoke {
		fmt.Fprintf(w, "revoked the agreement of owner %s to %s of agent %s (digest %s) as of %s: the seller's node refuses new requests under it from now on\n",
			r.Owner, r.SKU, r.Seller, r.Digest, r.RevokedAt)
		return
	}
	until := "no expiry"
	if r.ExpiresAt != "" {
		until = "until " + r.ExpiresAt
	}
	fmt.Fprintf(w, "agreed: owner %s accepts %s of agent %s at %s, terms digest %s, %s\n", r.Owner, r.SKU, r.Seller, PriceText(r.Price), r.Digest, until)
}

// PriceText is a SKU's price for people (daemon.PriceText).
func PriceText(v any) string { return daemon.PriceText(v) }

func runAgreements(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("agreements", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	var list []agreements.Entry
	if err := e.commerceDo(ctx, daemon.CommerceCommand{Verb: daemon.CommerceList}, &list); err != nil {
		return err
	}
	if *asJSON {
		if list == nil {
			list = []agreements.Entry{}
		}
		return printJSON(e.Stdout, list)
	}
	printAgreements(e.Stdout, list)
	return nil
}

// printAgreements lists agreements one per line, with what a stale one
// needs.
func printAgreements(w io.Writer, list []agreements.Entry) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no agreements")
		return
	}
	for _, a := range list {
		line := fmt.Sprintf("%-8s %s of agent %s, digest %s, agreed %s", a.State, a.SKU, a.SellerAgent, a.SKUDigest, a.AgreedAt)
		if a.ExpiresAt != "" {
			line += ", expires " + a.ExpiresAt
		}
		switch a.State {
		case agreements.StateRevoked:
			line += ", revoked " + a.RevokedAt
		case agreements.StateStale:
			if a.CurrentDigest == "" {
				line += " (the seller no longer sells it)"
			} else {
				line += fmt.Sprintf(" (the seller's terms changed to digest %s: run `mesh-adapter agree %s %s --digest %s` to agree to them)", a.CurrentDigest, a.SellerAgent, a.SKU, a.CurrentDigest)
			}
		}
		fmt.Fprintln(w, line)
	}
}
