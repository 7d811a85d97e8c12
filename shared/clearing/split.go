package clearing

import "agentmesh.dev/mesh/shared/commerce"

// Split is who pays and who receives for one rated charge
// (commerce.Split: the agreements service quotes the same retail price at
// admission).
type Split = commerce.Split

// SplitOf is commerce.SplitOf.
func SplitOf(rate int64, markupPct int, resale bool) (Split, error) {
	return commerce.SplitOf(rate, markupPct, resale)
}
