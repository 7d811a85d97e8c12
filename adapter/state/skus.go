package state

import (
	"errors"
	"fmt"
	"os"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// SKUsFile is skus.json: what the agent sells, the manifest's skus member
// as published (a JSON array of SKUs, docs/commerce.md). Every
// registration carries it; `start --skus <file>` replaces it.
const SKUsFile = "skus.json"

// maxSKUsFile bounds skus.json: far more than a manifest's 256 SKUs need.
const maxSKUsFile = 1 << 20

// ParseSKUs reads a skus document, a JSON array of SKUs, with
// commerce.SKUsFromValue; the error names source and the rule broken.
func ParseSKUs(data []byte, source string) ([]commerce.SKU, error) {
	if len(data) > maxSKUsFile {
		return nil, fmt.Errorf("%s is %d bytes; a SKUs file is at most %d", source, len(data), maxSKUsFile)
	}
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s is not JSON: %w", source, err)
	}
	skus, err := commerce.SKUsFromValue(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %s (a JSON array of SKUs, see docs/commerce.md)", source, errs.As(err).Message)
	}
	return skus, nil
}

// SKUs reads skus.json; none when it is absent.
func (d *Dir) SKUs() ([]commerce.SKU, error) {
	path := d.File(SKUsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	skus, err := ParseSKUs(data, path)
	if err != nil {
		return nil, fmt.Errorf("%w; fix it, or remove it with `mesh-adapter start --skus none`", err)
	}
	return skus, nil
}

// SaveSKUs writes skus.json after checking it reads; data nil removes it.
func (d *Dir) SaveSKUs(data []byte) error {
	path := d.File(SKUsFile)
	if data == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	if _, err := ParseSKUs(data, "the SKUs"); err != nil {
		return err
	}
	return keys.WriteSecretFile(path, data)
}
