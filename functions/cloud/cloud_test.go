package cloud

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/tsa"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/ratelimit"
)

func TestFromEnv(t *testing.T) {
	base := map[string]string{
		"GOOGLE_CLOUD_PROJECT": "p1", "MESH_CONTROL_URL": "https://api.example.org", "MESH_CONSOLE_URL": "https://console.example.org/",
		"SMTP_ADDR": "smtp.example.org:587", "SMTP_FROM": "mesh@example.org", "MESH_NATS_URLS": "tls://a:4222, tls://b:4222",
		"MESH_DEPLOYER_SA": "mesh-deployer@p1-proj.iam.gserviceaccount.com",
	}
	env := func(over map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := over[k]; ok {
				return v
			}
			return base[k]
		}
	}
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.MeshName != "p1" || len(c.NATSURLs) != 2 || c.NATSURLs[1] != "tls://b:4222" || c.MarkupPct != 10 || c.TrustedProxyHops != 1 || c.RateLimit != 30 ||
		c.RegistrarURL != "https://api.example.org" || c.SecretsProject != "p1" || c.NoKeys || c.SecretManagerHost != "" ||
		len(c.InternalNATSURLs) != 2 || c.InternalNATSURLs[0] != "tls://a:4222" || c.Deployer != "mesh-deployer@p1-proj.iam.gserviceaccount.com" {
		t.Errorf("defaults: %+v", c)
	}
	for name, over := range map[string]map[string]string{
		"missing project":  {"GOOGLE_CLOUD_PROJECT": ""},
		"missing nats":     {"MESH_NATS_URLS": " , "},
		"bad markup":       {"CREDITS_PLATFORM_MARKUP_PCT": "-3"},
		"bad hops":         {"MESH_TRUSTED_PROXY_HOPS": "one"},
		"missing smtp":     {"SMTP_ADDR": ""},
		"missing console":  {"MESH_CONSOLE_URL": ""},
		"missing deployer": {"MESH_DEPLOYER_SA": " "},
		"bad keys mode":    {"MESH_KEYS": "files"},
	} {
		if _, err := FromEnv(env(over)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name == "missing project" && !strings.Contains(err.Error(), "GOOGLE_CLOUD_PROJECT") {
			t.Errorf("the error must name what is missing: %v", err)
		}
	}
	c, _ = FromEnv(env(map[string]string{"CREDITS_PLATFORM_MARKUP_PCT": "0", "MESH_NODE_CREDENTIAL_NO_EXPIRY": "true",
		"MESH_REGISTRAR_URL": "https://names.example.org", "MESH_SECRETS_PROJECT": "keys-project", "MESH_KEYS": "none",
		"MESH_NATS_INTERNAL_URLS": "nats://10.0.0.2:4222"}))
	if c.MarkupPct != 0 || !c.NoExpiry || c.RegistrarURL != "https://names.example.org" || c.SecretsProject != "keys-project" || !c.NoKeys ||
		len(c.InternalNATSURLs) != 1 || c.NATSURLs[0] != "tls://a:4222" {
		t.Errorf("explicit values: %+v", c)
	}
}

// Every flood limit is read from its MESH_LIMIT_* variable, the same one
// meshd reads, and defaults to the service's default; a bad value is refused
// naming the variable.
func TestFromEnvLimits(t *testing.T) {
	base := map[string]string{
		"GOOGLE_CLOUD_PROJECT": "p1", "MESH_CONTROL_URL": "https://api.example.org", "MESH_CONSOLE_URL": "https://console.example.org/",
		"SMTP_ADDR": "smtp.example.org:587", "SMTP_FROM": "mesh@example.org", "MESH_NATS_URLS": "tls://a:4222",
		"MESH_DEPLOYER_SA": "mesh-deployer@p1-proj.iam.gserviceaccount.com",
	}
	env := func(over map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := over[k]; ok {
				return v
			}
			return base[k]
		}
	}
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.GuestLimits != guest.DefaultLimits() || c.AccountLimits != account.DefaultLimits() {
		t.Errorf("defaults: %+v %+v", c.GuestLimits, c.AccountLimits)
	}
	c, err = FromEnv(env(map[string]string{
		"MESH_LIMIT_GUEST_POOL": "40", "MESH_LIMIT_GUEST_LIVE_PER_NETWORK": "4", "MESH_LIMIT_GUEST_PER_NETWORK": "7/10m",
		"MESH_LIMIT_SIGNUP_PER_ADDRESS": "2/1h", "MESH_LIMIT_CONNECT_OVERALL": "9/24h", "MESH_LIMIT_MAIL_PER_RECIPIENT": "3/30m",
	}))
	if err != nil {
		t.Fatal(err)
	}
	g, a := c.GuestLimits, c.AccountLimits
	if g.Pool != 40 || g.LivePerNetwork != 4 || g.PerNetwork != (ratelimit.Rate{Max: 7, Window: 10 * time.Minute}) ||
		g.LivePerAddress != guest.DefaultLimits().LivePerAddress ||
		a.SignUp.PerAddress != (ratelimit.Rate{Max: 2, Window: time.Hour}) || a.Connect.Overall != (ratelimit.Rate{Max: 9, Window: 24 * time.Hour}) ||
		a.MailPerRecipient != (ratelimit.Rate{Max: 3, Window: 30 * time.Minute}) || a.SignIn != account.DefaultLimits().SignIn {
		t.Errorf("explicit limits: %+v %+v", g, a)
	}
	for name, over := range map[string]map[string]string{
		"MESH_LIMIT_GUEST_PER_ADDRESS":      {"MESH_LIMIT_GUEST_PER_ADDRESS": "20"},
		"MESH_LIMIT_LOGIN_PER_NETWORK":      {"MESH_LIMIT_LOGIN_PER_NETWORK": "0/1h"},
		"MESH_LIMIT_GUEST_LIVE_PER_ADDRESS": {"MESH_LIMIT_GUEST_LIVE_PER_ADDRESS": "-1"},
		"reserve":                           {"MESH_LIMIT_GUEST_POOL": "10", "MESH_LIMIT_GUEST_RESERVE": "10"},
	} {
		if _, err := FromEnv(env(over)); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(name, "reserve")) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// MESH_TIMESTAMP_AUTHORITIES names the anchors' authorities: two or more,
// each with its root; unset, the anchors are not configured.
func TestFromEnvTimestampAuthorities(t *testing.T) {
	base := map[string]string{
		"GOOGLE_CLOUD_PROJECT": "p1", "MESH_CONTROL_URL": "https://api.example.org", "MESH_CONSOLE_URL": "https://console.example.org/",
		"SMTP_ADDR": "smtp.example.org:587", "SMTP_FROM": "mesh@example.org", "MESH_NATS_URLS": "tls://a:4222",
		"MESH_DEPLOYER_SA": "mesh-deployer@p1-proj.iam.gserviceaccount.com",
	}
	var cfgs []audit.AuthorityConfig
	for _, name := range []string{"one", "two"} {
		a, err := tsa.New(name)
		if err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, audit.AuthorityConfig{Name: name, URL: "https://" + name + ".example.org/tsr", RootPEM: string(a.RootPEM())})
	}
	two, _ := json.Marshal(cfgs)
	one, _ := json.Marshal(cfgs[:1])
	for _, c := range []struct {
		value string
		n     int
		ok    bool
	}{
		{"", 0, true},
		{string(two), 2, true},
		{string(one), 0, false},
		{`[{"name":"x","url":"ftp://x","root_pem":""}]`, 0, false},
		{"not json", 0, false},
	} {
		env := func(k string) string {
			if k == "MESH_TIMESTAMP_AUTHORITIES" {
				return c.value
			}
			return base[k]
		}
		got, err := FromEnv(env)
		if (err == nil) != c.ok || (c.ok && len(got.TimestampAuthorities) != c.n) {
			t.Errorf("%.40q: %d authorities, %v", c.value, len(got.TimestampAuthorities), err)
		}
	}
}
