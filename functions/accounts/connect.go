package accounts

import (
	"context"
	"net/http"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
)

// The connect routes (spec §4.4): an app names a person's email and its own
// name and gets app credentials, at once with that person's session, or
// after the person passes it the code mailed to them. The protocol, and how
// the credentials go out exactly once, is in shared/account/connect.go.

const (
	noteShownOnce = "shown once: store seed and creds now; later status calls answer without them"
	noteConnected = "the credentials were handed out once, to the call that completed this request, and are not shown again; " +
		"refresh the JWT from a signed-in session at POST /v1/accounts/{id}/apps/{app_id}/refresh, or connect again for a new app"
)

// appIssuer adapts the credential service to account.AppIssuer and keeps
// the credentials of the app it made, for the one answer that carries them.
type appIssuer struct {
	*credential.Service
	res credential.AppResult
}

func (a *appIssuer) IssueApp(ctx context.Context, accountID, name string) (string, error) {
	res, err := a.CreateApp(ctx, accountID, name)
	if err != nil {
		return "", err
	}
	a.res = res
	return res.AppID, nil
}

// issuedFields are the members of an answer carrying new app credentials.
func issuedFields(res credential.AppResult) map[string]any {
	return map[string]any{"status": account.ConnectConnected, "app_id": res.AppID, "name": res.Name, "public_key": res.PublicKey,
		"jwt": res.JWT, "seed": res.Seed, "creds": res.Creds, "expires_at": res.ExpiresAt, "mesh": res.Mesh, "inbox_prefix": res.InboxPrefix,
		"note": noteShownOnce}
}

func (h *handlers) connect(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Email   string `json:"email"`
		AppName string `json:"app_name"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	apps := &appIssuer{Service: h.d.Credentials}
	st, err := h.acc.StartConnect(r.Context(), b.Email, b.AppName, httpx.BearerToken(r), httpx.ClientKey(r, h.d.TrustedProxyHops), apps)
	if err != nil {
		return err
	}
	if st.Connected {
		return ok(w, http.StatusOK, issuedFields(apps.res))
	}
	return ok(w, http.StatusAccepted, map[string]any{"status": "verification_required", "request_id": st.RequestID,
		"poll_after_ms": account.ConnectPollAfter.Milliseconds(), "expires_at": protocol.FormatTime(st.ExpiresAt), "delivery": "email",
		"next": "POST /v1/connect/status with {request_id} to poll, and with {request_id, code} once the person gives you the mailed code"})
}

func (h *handlers) connectStatus(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		RequestID string `json:"request_id"`
		Code      string `json:"code"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	apps := &appIssuer{Service: h.d.Credentials}
	st, err := h.acc.ConnectStatus(r.Context(), b.RequestID, b.Code, apps)
	if err != nil {
		return err
	}
	if st.Issued {
		out := issuedFields(apps.res)
		out["request_id"] = st.RequestID
		return ok(w, http.StatusOK, out)
	}
	out := map[string]any{"status": st.Status, "request_id": st.RequestID}
	switch st.Status {
	case account.ConnectPending:
		out["app_name"], out["expires_at"] = st.AppName, protocol.FormatTime(st.ExpiresAt)
		out["poll_after_ms"] = account.ConnectPollAfter.Milliseconds()
	case account.ConnectConnected:
		out["app_id"], out["note"] = st.AppID, noteConnected
	case account.ConnectExpired:
		out["expires_at"] = protocol.FormatTime(st.ExpiresAt)
		out["note"] = "the request expired before it was approved; start again with POST /v1/connect"
	case account.ConnectDenied:
		out["note"] = "the request was denied; start again with POST /v1/connect"
	}
	return ok(w, http.StatusOK, out)
}
