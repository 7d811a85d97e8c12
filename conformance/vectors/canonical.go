package vectors

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"

	"agentmesh.dev/mesh/shared/protocol"
)

// checkCanonical: parse each input_json with our parser and canonicalise;
// feed each number_bits double straight to the canonicaliser.
func checkCanonical(t *T, doc map[string]any) {
	if vs, ok := doc["vectors"].([]any); ok {
		for i, v := range vs {
			m := obj(v)
			t.Run("vectors/"+caseName(m, fmt.Sprint(i)), func() error {
				parsed, err := protocol.ParseJSON([]byte(str(m["input_json"])))
				if err != nil {
					return err
				}
				got, err := protocol.Canonical(parsed)
				if err != nil {
					return err
				}
				return quoteDiff(string(got), str(m["canonical"]))
			})
		}
	}
	if rows, ok := doc["number_bits"].([]any); ok {
		for _, r := range rows {
			m := obj(r)
			h := str(m["ieee754_hex"])
			t.Run("number_bits/"+h, func() error {
				b, err := hex.DecodeString(h)
				if err != nil || len(b) != 8 {
					return fmt.Errorf("ieee754_hex %q is not 8 bytes of hex", h)
				}
				f := math.Float64frombits(binary.BigEndian.Uint64(b))
				got, err := protocol.Canonical(f)
				if err != nil {
					return err
				}
				return quoteDiff(string(got), str(m["canonical"]))
			})
		}
	}
}
