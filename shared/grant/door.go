package grant

import (
	"errors"
	"regexp"
	"strings"

	"agentmesh.dev/mesh/shared/errs"
)

// Google's naming rules. A project id is 6–30 lower-case letters, digits
// and hyphens, starting with a letter and not ending with a hyphen; an
// account id (the part before '@') a user can create is the same, 6–30
// long. Anything a user cannot create (a leading digit, "service-<number>",
// a domain other than <project>.iam.gserviceaccount.com) is Google's own.
var (
	projectIDRE = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
	accountIDRE = regexp.MustCompile(`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`)
)

const iamDomain = ".iam.gserviceaccount.com"

// CheckRequest validates a POST body at the door (spec §7.4), before
// anything is recorded or called: the provider is refused by name unless it
// is the supported one; the project id must be one Google could have made;
// and the service account must be an account the customer created in that
// project. Google's default compute account, the App Engine default account
// and Google-managed service agents are each refused with their own
// message: they are shared with Google's own services, and a customer
// cannot give them to us alone. Addresses are compared in lower case, as
// Google stores them. The returned request is the normalised one.
func CheckRequest(r Request) (Request, error) {
	if err := CheckProvider(r.Provider); err != nil {
		return r, err
	}
	r.ProjectID = strings.TrimSpace(r.ProjectID)
	r.ServiceAccount = strings.ToLower(strings.TrimSpace(r.ServiceAccount))
	switch {
	case r.ProjectID == "":
		return r, errs.New(errs.InvalidRequest, "project_id is required: the id of your Google Cloud project, e.g. acme-agents")
	case strings.Contains(r.ProjectID, ":"):
		return r, errs.New(errs.InvalidRequest, "project_id names a domain-scoped project (example.com:project), which grants do not support; use a project with a plain id")
	case !projectIDRE.MatchString(r.ProjectID):
		return r, errs.Newf(errs.InvalidRequest, "project_id %q is not a Google Cloud project id: 6 to 30 lower-case letters, digits and hyphens, starting with a letter (the id, not the name or the number)", clip(r.ProjectID, 64))
	case r.ServiceAccount == "":
		return r, errs.Newf(errs.InvalidRequest, "service_account is required: the address of the account you created, e.g. mesh-agent@%s%s", r.ProjectID, iamDomain)
	}
	if err := checkCustomerAccount(r.ServiceAccount, r.ProjectID); err != nil {
		return r, err
	}
	return r, nil
}

// checkCustomerAccount is the door's rule for the service account.
func checkCustomerAccount(sa, project string) error {
	local, domain, ok := strings.Cut(sa, "@")
	if !ok || local == "" || strings.Contains(domain, "@") {
		return errs.Newf(errs.InvalidRequest, "service_account %q is not an address: it looks like name@%s%s", clip(sa, 80), project, iamDomain)
	}
	switch {
	case domain == "developer.gserviceaccount.com": // <number>-compute@

		return errs.New(errs.InvalidRequest, "service_account is the Compute Engine default service account, which is refused: it is shared by every VM and service in the project. Create a dedicated account (docs/grants.md) and name that one")
	case domain == "appspot.gserviceaccount.com":
		return errs.New(errs.InvalidRequest, "service_account is the App Engine default service account, which is refused: it is shared with App Engine and Cloud Functions. Create a dedicated account (docs/grants.md) and name that one")
	case isServiceAgent(local, domain):
		return errs.New(errs.InvalidRequest, "service_account is a Google-managed service agent, which is refused: Google's own services act as it. Create a dedicated account (docs/grants.md) and name that one")
	case domain != project+iamDomain:
		return errs.Newf(errs.InvalidRequest, "service_account %q does not belong to project %s: an account created there ends in @%s%s", clip(sa, 80), project, project, iamDomain)
	case !accountIDRE.MatchString(local):
		return errs.Newf(errs.InvalidRequest, "service_account %q is not an account a project can create: the part before @ is 6 to 30 lower-case letters, digits and hyphens, starting with a letter", clip(sa, 80))
	}
	return nil
}

// The account ids of Google's own agents in a project's
// iam.gserviceaccount.com domain: service-<project number>, and any id
// starting with a digit (<number>, <number>-compute, ... which no user
// can create). A user's account may well start "service-" (service-bot).
var agentLocalRE = regexp.MustCompile(`^(service-[0-9]+|[0-9].*)$`)

// isServiceAgent reports an address of Google's own: any
// *.gserviceaccount.com domain other than a project's
// <project>.iam.gserviceaccount.com (cloudservices., cloudbuild.,
// developer., appspot., system., ...), a service agent's gcp-sa-* project,
// or an account id matching agentLocalRE.
func isServiceAgent(local, domain string) bool {
	if domain != "gserviceaccount.com" && !strings.HasSuffix(domain, ".gserviceaccount.com") {
		return false
	}
	if !strings.HasSuffix(domain, iamDomain) {
		return true
	}
	project := strings.TrimSuffix(domain, iamDomain)
	return strings.HasPrefix(project, "gcp-sa-") || agentLocalRE.MatchString(local)
}

// checkServiceAccountShape is the looser rule for our own deployer's
// address (configuration, not a customer's input).
func checkServiceAccountShape(sa string) error {
	local, domain, ok := strings.Cut(sa, "@")
	if !ok || !accountIDRE.MatchString(local) || !strings.HasSuffix(domain, iamDomain) ||
		!projectIDRE.MatchString(strings.TrimSuffix(domain, iamDomain)) {
		return errors.New("want name@project.iam.gserviceaccount.com")
	}
	return nil
}
