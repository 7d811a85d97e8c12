// Command audit-verify checks an audit export bundle offline: every row of
// every chain, the manifest's signature, every anchor's timestamps and
// every inclusion proof (docs/audit.md). It makes no network request.
//
//	audit-verify [-key U…] [-roots roots.pem] bundle.json
//
// -key pins the mesh's export key and -roots the timestamp authorities'
// roots; without them the keys the bundle names are used, and the command
// says so. It exits 0 when every link holds under pinned keys, 3 when every
// link holds but only against the keys the bundle names (self-consistent
// only: anyone can make such a bundle), 1 naming the first link that does
// not hold, and 2 on a usage error.
package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"agentmesh.dev/mesh/shared/audit"
)

// Exit codes.
const (
	exitVerified       = 0
	exitFailed         = 1
	exitUsage          = 2
	exitSelfConsistent = 3
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("audit-verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	key := fs.String("key", "", "the mesh's export key (U…); the manifest must be signed by it")
	rootsFile := fs.String("roots", "", "a PEM file of trusted timestamp authority roots; every stamp must chain to one")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: audit-verify [-key U…] [-roots roots.pem] bundle.json")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	trust := audit.Trust{Signer: *key}
	if *rootsFile != "" {
		roots, err := readRoots(*rootsFile)
		if err != nil {
			fmt.Fprintf(stderr, "audit-verify: %v\n", err)
			return exitUsage
		}
		trust.Roots = roots
	}
	data, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "audit-verify: %v\n", err)
		return exitUsage
	}
	b, err := audit.ParseBundle(data)
	if err != nil {
		fmt.Fprintf(stderr, "audit-verify: %v\n", err)
		return exitFailed
	}
	s, err := audit.Check(b, trust)
	if err != nil {
		fmt.Fprintf(stderr, "audit-verify: FAILED: %v\n", err)
		return exitFailed
	}
	// Pinned: the export key, and the roots when there are stamps to chain.
	pinned := trust.Signer != "" && (trust.Roots != nil || s.Stamps == 0)
	verdict := "verified"
	if !pinned {
		verdict = "self-consistent only (no -key/-roots pinned)"
	}
	fmt.Fprintf(stdout, "%s: %d chains, %d rows (%d under a timestamped anchor), %d anchors", verdict, s.Chains, s.Rows, s.AnchoredRows, s.Anchors)
	if s.Anchors > 0 {
		fmt.Fprintf(stdout, " from %s to %s with %d timestamps", s.FirstAnchor, s.LastAnchor, s.Stamps)
	}
	fmt.Fprintf(stdout, ", %d inclusion proofs\n", s.Proofs)
	for _, a := range s.Stamped {
		fmt.Fprintf(stdout, "anchor %s: first stamped %s\n", a.Date, a.Earliest.UTC().Format(time.RFC3339))
	}
	if trust.Signer == "" {
		fmt.Fprintf(stdout, "note: the export key %s was taken from the bundle; pass -key with the key the mesh publishes to pin it\n", b.Manifest.Signer)
	}
	if trust.Roots == nil && s.Stamps > 0 {
		fmt.Fprintln(stdout, "note: the authorities' roots were taken from the bundle; pass -roots with the roots you trust to pin them")
	}
	if !pinned {
		return exitSelfConsistent
	}
	return exitVerified
}

// readRoots reads every certificate of a PEM file.
func readRoots(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, data = pem.Decode(data)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New(path + ": no PEM certificate in it")
	}
	return out, nil
}
