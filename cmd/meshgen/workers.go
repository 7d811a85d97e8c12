package main

import (
	"fmt"
	"maps"
	"regexp"
	"slices"

	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/workers"
)

// Worker is one row of the worker table, as much of it as the deployment
// needs: the name (the binary is ./workers/cmd/<name>-worker, its image
// <name>-worker), how many copies Cloud Run keeps, and their size.
type Worker struct {
	Name         string
	MinInstances int
	MaxInstances int
	CPU, Memory  string
	// Env are the worker's own variables (Terraform expressions), beside
	// the bus and the secrets every worker gets.
	Env map[string]string
	// Trust says the worker reads the four trust seeds too
	// (workers.ReadsTrust: the rooms worker, which mints and revokes acl
	// room credentials).
	Trust bool
}

// workerRows is the worker table (package workers) as the generator reads
// it.
func workerRows() []Worker {
	var rows []Worker
	for _, w := range workers.Table() {
		rows = append(rows, Worker{Name: w.Name, MinInstances: w.MinInstances, MaxInstances: w.MaxInstances, CPU: w.CPU, Memory: w.Memory,
			Env: w.CloudEnv, Trust: workers.ReadsTrust(w.Name)})
	}
	return rows
}

var (
	workerName = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)
	envName    = regexp.MustCompile(`^MESH_[A-Z0-9_]+$`)
)

// credsSecret is the Secret Manager secret holding a worker's NATS
// credential (a creds file), written by `meshd cloud init`.
func credsSecret(worker string) string { return "mesh-worker-" + worker + "-creds" }

// servicesSecret holds the seed the workers sign their answers with.
const servicesSecret = "mesh-services-seed"

// trustSecrets are the four seeds of the trust chain, which a worker with
// Trust reads: the operator's (it re-signs the mesh account JWT to revoke),
// the system account's (it pushes the update), the mesh account's and its
// signing key's (it mints).
var trustSecrets = []string{cloudsecrets.OperatorSeed, cloudsecrets.SystemAccountSeed, cloudsecrets.AccountSeed, cloudsecrets.AccountSigningSeed}

func workerConfig(workers []Worker) (tf, error) {
	accounts, access, services := tf{}, tf{}, tf{}
	names := []string{}
	seen := map[string]bool{}
	for _, w := range workers {
		switch {
		case !workerName.MatchString(w.Name):
			return nil, fmt.Errorf("worker %q: a name is 1-12 lower-case letters or digits, starting with a letter", w.Name)
		case seen[w.Name]:
			return nil, fmt.Errorf("worker %q is declared twice", w.Name)
		case w.MinInstances < 1 || w.MaxInstances < w.MinInstances:
			return nil, fmt.Errorf("worker %q: instances must be 1 <= min <= max, not %d..%d", w.Name, w.MinInstances, w.MaxInstances)
		}
		seen[w.Name] = true
		names = append(names, w.Name)
		res := "worker_" + w.Name
		account := "${google_service_account." + res + ".email}"
		description := "Runs the " + w.Name + " bus worker; reads only its own credential and the services seed."
		if w.Trust {
			description = "Runs the " + w.Name + " bus worker; reads its own credential, the services seed and the trust seeds (it mints and revokes acl room credentials)."
		}
		accounts[res] = tf{
			"account_id":   "${var.prefix}-w-" + w.Name,
			"display_name": "mesh " + w.Name + " worker (Cloud Run)",
			"description":  description,
		}
		env := []tf{
			{"name": "MESH_NATS_URL", "value": "${local.nats_internal_urls}"},
			{"name": "MESH_SECRETS_PROJECT", "value": "${var.project}"},
		}
		for _, k := range slices.Sorted(maps.Keys(w.Env)) {
			if !envName.MatchString(k) || k == "MESH_NATS_URL" || k == "MESH_SECRETS_PROJECT" {
				return nil, fmt.Errorf("worker %q: variable %q is not one of its own MESH_* variables", w.Name, k)
			}
			env = append(env, tf{"name": k, "value": w.Env[k]})
		}
		creds := secretRef(credsSecret(w.Name))
		seed := secretRef(servicesSecret)
		access[res+"_creds"] = tf{"secret_id": "${" + creds + ".id}", "role": "roles/secretmanager.secretAccessor", "member": "serviceAccount:" + account}
		access[res+"_services"] = tf{"secret_id": "${" + seed + ".id}", "role": "roles/secretmanager.secretAccessor", "member": "serviceAccount:" + account}
		grants := []string{
			"google_secret_manager_secret_iam_member." + res + "_creds",
			"google_secret_manager_secret_iam_member." + res + "_services",
		}
		if w.Trust {
			for i, secret := range trustSecrets {
				name := fmt.Sprintf("%s_trust%d", res, i)
				access[name] = tf{"secret_id": "${" + secretRef(secret) + ".id}", "role": "roles/secretmanager.secretAccessor", "member": "serviceAccount:" + account}
				grants = append(grants, "google_secret_manager_secret_iam_member."+name)
			}
		}
		services[res] = tf{
			"name":     "${var.prefix}-" + w.Name + "-worker",
			"location": "${var.region}",
			// A worker takes no HTTP traffic: Cloud Run probes its health
			// port, nothing else may reach it.
			"ingress":             "INGRESS_TRAFFIC_INTERNAL_ONLY",
			"deletion_protection": false,
			"labels":              "${local.labels}",
			"template": tf{
				"service_account": account,
				"scaling":         tf{"min_instance_count": w.MinInstances, "max_instance_count": w.MaxInstances},
				"vpc_access":      tf{"connector": "${google_vpc_access_connector.mesh.id}", "egress": "PRIVATE_RANGES_ONLY"},
				"containers": tf{
					"image": "${local.worker_image_prefix}/" + w.Name + "-worker:${var.image_tag}",
					// The worker reads its credential and the services seed
					// through the Secret Manager API at start, as the
					// functions do: no seed sits on a volume whose file mode
					// must be right.
					"env": env,
					// CPU stays allocated between requests: a worker's work
					// arrives on the bus, never as a request.
					"resources":      tf{"cpu_idle": false, "limits": tf{"cpu": w.CPU, "memory": w.Memory}},
					"startup_probe":  tf{"http_get": tf{"path": "/healthz"}, "period_seconds": 5, "failure_threshold": 12},
					"liveness_probe": tf{"http_get": tf{"path": "/healthz"}, "period_seconds": 30, "failure_threshold": 3},
				},
			},
			"depends_on": append([]string{"google_project_service.enabled"}, grants...),
		}
	}
	return tf{
		"//":     header("the worker table (package workers)"),
		"locals": tf{"worker_names": names},
		"resource": tf{
			"google_service_account":                  accounts,
			"google_secret_manager_secret_iam_member": access,
			"google_cloud_run_v2_service":             services,
		},
	}, nil
}

// secretRef is the reference to one of the secret containers of
// terraform/secrets.tf.
func secretRef(secret string) string {
	return `google_secret_manager_secret.mesh["` + secret + `"]`
}
