package fence

import (
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/ratelimit"
)

// Classes are the limits of the two fence classes as an operator sets them
// (docs/security.md): what a guest credential and a node credential for a
// roster no account owns may publish and hold open.
type Classes struct {
	Guest, Unowned creds.ClassLimits
}

// DefaultClasses are creds.DefaultClassLimits.
func DefaultClasses() Classes {
	d := creds.DefaultClassLimits()
	return Classes{Guest: d[creds.ClassGuest], Unowned: d[creds.ClassUnowned]}
}

// Map is c keyed by class name, as the minting services and the fence read
// it.
func (c Classes) Map() map[string]creds.ClassLimits {
	return map[string]creds.ClassLimits{creds.ClassGuest: c.Guest, creds.ClassUnowned: c.Unowned}
}

// Knobs are the operator settings of c (meshd flags, and the same
// MESH_LIMIT_* variables for meshd, the Cloud Functions and the fence).
func (c *Classes) Knobs() []ratelimit.Knob {
	var out []ratelimit.Knob
	for _, k := range []struct {
		name, who string
		l         *creds.ClassLimits
	}{{"guest", "a guest credential", &c.Guest}, {"unowned", "a node credential for a roster no account owns", &c.Unowned}} {
		p := "limit-" + k.name + "-"
		out = append(out,
			ratelimit.CountKnob(p+"connections", "connections "+k.who+" may hold open at once", 1, &k.l.Conns),
			ratelimit.CountKnob(p+"msgs-per-sec", "messages per second one connection of "+k.who+" may publish", 1, &k.l.MsgsPerSec),
			ratelimit.SizeKnob(p+"bytes-per-sec", "bytes per second one connection of "+k.who+" may publish", 1<<10, &k.l.BytesPerSec),
			ratelimit.SizeKnob(p+"payload", "largest message "+k.who+" may publish (the broker closes a connection over it)", 1<<10, &k.l.Payload),
			ratelimit.Count64Knob(p+"subscriptions", "subscriptions one connection of "+k.who+" may hold", 16, &k.l.Subs),
		)
	}
	return out
}
