package devenv

import (
	"encoding/json"
	"net/http"
	"time"
)

// healthz is the body of GET /healthz.
type healthz struct {
	OK      bool  `json:"ok"`
	NATS    bool  `json:"nats"`
	UptimeS int64 `json:"uptime_s"`
}

// handleHealthz reports whether the bus is usable: the broker is running and
// meshd's own system-account connection to it is up. 503 otherwise, so a load
// balancer or a script waiting for readiness can rely on the status alone.
func (m *Mesh) handleHealthz(w http.ResponseWriter, r *http.Request) {
	natsOK := m.broker != nil && m.broker.Healthy()
	body := healthz{
		OK:      natsOK,
		NATS:    natsOK,
		UptimeS: int64(time.Since(m.started) / time.Second),
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !natsOK {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}
