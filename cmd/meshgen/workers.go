package main

import (
	"fmt"
	"regexp"
)

// Worker is one row of the worker table, as much of it as the deployment
// needs: the name (the binary is ./workers/cmd/<name>-worker, its image
// <name>-worker) and how many copies Cloud Run keeps.
type Worker struct {
	Name         string
	MinInstances int
	MaxInstances int
}

// workerRows is the worker table as the generator reads it. It is the one
// place the generator learns the workers and their replica counts: when
// the worker table (package workers, with each row's production
// configuration) is on main, this function returns its rows instead.
//
// One copy of each is enough for correctness (every endpoint is in a
// queue group and every state change a compare-and-set, DESIGN §5); the
// maximum lets Cloud Run add copies under CPU load.
func workerRows() []Worker {
	var rows []Worker
	for _, name := range []string{"registry", "presence", "feeds", "tasks", "admission", "activity", "mailbox"} {
		rows = append(rows, Worker{Name: name, MinInstances: 1, MaxInstances: 3})
	}
	return rows
}

// The paths the worker's secrets are mounted at. Each secret is its own
// volume (Cloud Run mounts one secret per directory), every file mode
// 0400: the worker refuses a seed file that group or others may read.
const (
	credsDir     = "/secrets/creds"
	credsFile    = "worker.creds"
	servicesDir  = "/secrets/services"
	servicesFile = "services.seed"
	secretMode   = 0o400
)

var workerName = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

// credsSecret is the Secret Manager secret holding a worker's NATS
// credential (a creds file), written by `meshd cloud init`.
func credsSecret(worker string) string { return "mesh-worker-" + worker + "-creds" }

// servicesSecret holds the seed the workers sign their answers with.
const servicesSecret = "mesh-services-seed"

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
		accounts[res] = tf{
			"account_id":   "${var.prefix}-w-" + w.Name,
			"display_name": "mesh " + w.Name + " worker (Cloud Run)",
			"description":  "Runs the " + w.Name + " bus worker; reads only its own credential and the services seed.",
		}
		creds := secretRef(credsSecret(w.Name))
		seed := secretRef(servicesSecret)
		access[res+"_creds"] = tf{"secret_id": "${" + creds + ".id}", "role": "roles/secretmanager.secretAccessor", "member": "serviceAccount:" + account}
		access[res+"_services"] = tf{"secret_id": "${" + seed + ".id}", "role": "roles/secretmanager.secretAccessor", "member": "serviceAccount:" + account}
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
				"volumes": []tf{
					secretVolume("creds", creds, credsFile),
					secretVolume("services", seed, servicesFile),
				},
				"containers": tf{
					"image": "${local.worker_image_prefix}/" + w.Name + "-worker:${var.image_tag}",
					"env": []tf{
						{"name": "MESH_NATS_URL", "value": "${local.nats_internal_urls}"},
						{"name": "MESH_CREDS_FILE", "value": credsDir + "/" + credsFile},
						{"name": "MESH_SERVICES_KEY_FILE", "value": servicesDir + "/" + servicesFile},
					},
					// CPU stays allocated between requests: a worker's work
					// arrives on the bus, never as a request.
					"resources": tf{"cpu_idle": false, "limits": tf{"cpu": "${var.worker_cpu}", "memory": "${var.worker_memory}"}},
					"volume_mounts": []tf{
						{"name": "creds", "mount_path": credsDir},
						{"name": "services", "mount_path": servicesDir},
					},
					"startup_probe":  tf{"http_get": tf{"path": "/healthz"}, "period_seconds": 5, "failure_threshold": 12},
					"liveness_probe": tf{"http_get": tf{"path": "/healthz"}, "period_seconds": 30, "failure_threshold": 3},
				},
			},
			"depends_on": []string{
				"google_project_service.enabled",
				"google_secret_manager_secret_iam_member." + res + "_creds",
				"google_secret_manager_secret_iam_member." + res + "_services",
			},
		}
	}
	return tf{
		"//":     header("the worker table (cmd/meshgen workerRows)"),
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

func secretVolume(name, secret, file string) tf {
	return tf{"name": name, "secret": tf{
		"secret": "${" + secret + ".secret_id}",
		"items":  []tf{{"version": "latest", "path": file, "mode": secretMode}},
	}}
}
