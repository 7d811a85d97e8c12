package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/shared/commerce"
)

func init() {
	register(&command{name: "credits", usage: "[--json]",
		summary: "show the owner's credit balance and recent history",
		help: `Shows the credits (XCR) of the owner this agent is registered with: the
balance, then the latest rows of its history (purchases of paid SKUs, sales
by the owner's agents, grants), newest first. Credits are spent inside the
mesh only; the operator grants them (meshd admin credits grant). Asks the
running adapter, or brings the agent up for the command.

  --json   print the clearing service's answers as JSON

Example:
  mesh-adapter credits`,
		run: runCredits})
}

func runCredits(ctx context.Context, e *Env, args []string) error {
	fs := flag.NewFlagSet("credits", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("credits takes no arguments")
	}
	var res daemon.CreditsResult
	err = e.call(control.Request{Op: "credits"}, &res, 30*time.Second)
	if errors.Is(err, control.ErrNotRunning) {
		dir, derr := e.openState()
		if derr != nil {
			return derr
		}
		res, err = daemon.Credits(ctx, daemon.Config{Dir: dir, ControlURL: e.ControlURL, RegistrarURL: e.RegistrarURL, Out: e.Stderr, Log: e.logger()})
	}
	if err != nil {
		return fmt.Errorf("the clearing service refused or did not answer: %w", err)
	}
	if *asJSON {
		return printJSON(e.Stdout, res)
	}
	printCredits(e.Stdout, res)
	return nil
}

// printCredits writes the balance line, then one line per history row.
func printCredits(w io.Writer, res daemon.CreditsResult) {
	micro := func(v any) int64 { f, _ := v.(float64); return int64(f) }
	fmt.Fprintf(w, "owner %v: %s credits\n", res.Balance["owner"], commerce.FormatCredits(micro(res.Balance["credits"])))
	entries, _ := res.History["entries"].([]any)
	if len(entries) == 0 {
		fmt.Fprintln(w, "no history yet")
		return
	}
	for _, x := range entries {
		en, _ := x.(map[string]any)
		line := fmt.Sprintf("%v  %-8v %12s", en["at"], en["kind"], commerce.FormatCredits(micro(en["amount_micro"])))
		if sku, _ := en["sku"].(string); sku != "" {
			line += "  " + sku
		}
		if o, _ := en["offering"].(string); o != "" {
			line += " (" + o + ")"
		}
		if u := micro(en["unpaid_micro"]); u > 0 {
			line += fmt.Sprintf("  unpaid %s", commerce.FormatCredits(u))
		}
		if r, _ := en["reason"].(string); r != "" {
			line += "  " + r
		}
		fmt.Fprintln(w, line)
	}
	if res.History["next"] != nil {
		fmt.Fprintln(w, "(older rows exist; --json shows the cursor for mesh.credits.history)")
	}
}
