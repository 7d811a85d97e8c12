package devenv

import (
	"fmt"
	"path/filepath"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
)

// RegistrarKeyFile is the registrar's card-signing seed under the data
// directory (0600, made on first run). Resolvers pin its public key, so it
// must survive restarts.
const RegistrarKeyFile = "registrar.nk"

// startRegistrar builds the handle registrar on the control plane's store
// and mail; its routes (functions/registrar) are mounted with the other
// groups. On one machine the registrar is the same server as the control
// plane, so its URL is the control URL.
func (m *Mesh) startRegistrar(dataDir string, cfg Config, st store.Store, mailer mail.Sender) (*registrar.Service, error) {
	key, err := keys.LoadOrGenerate[keys.RegistrarRole](filepath.Join(dataDir, keysDir, RegistrarKeyFile))
	if err != nil {
		return nil, fmt.Errorf("devenv: registrar key: %w", err)
	}
	m.log.Info("registrar ready", "url", m.urls.Registrar, "registrar_key", key.Public(), "kid", registrar.Kid(key.Public()))
	return registrar.New(registrar.Config{Store: st, Mail: mailer, Signer: key, URL: m.urls.Registrar,
		Now: cfg.Now, Log: m.log.With("service", "registrar")}), nil
}
