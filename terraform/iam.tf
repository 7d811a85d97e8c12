# Service accounts, one per kind of work, each with only what it needs. No
# account holds a project-wide Editor or Owner role; secrets are granted
# one by one (secrets.tf, workers.tf.json).

# Every route's function runs as this account.
resource "google_service_account" "runtime" {
  account_id   = "${var.prefix}-runtime"
  display_name = "mesh control plane (Cloud Functions)"
  description  = "Runs every route's function: Firestore, the six seeds, and impersonation of the deployer."
}

# Cloud Build runs the functions' builds (source zip to image) as this one.
resource "google_service_account" "builder" {
  account_id   = "${var.prefix}-builder"
  display_name = "mesh function builds"
  description  = "Builds the route functions' images from the source zip."
}

# Cloud Scheduler calls the scheduled rows' functions with this identity;
# it is the only one allowed to invoke them (routes.tf.json).
resource "google_service_account" "scheduler" {
  account_id   = "${var.prefix}-scheduler"
  display_name = "mesh scheduled jobs"
  description  = "Invokes the scheduled route functions (sweeps) for Cloud Scheduler."
}

# The NATS servers' VMs: read the NATS configuration secrets, write logs.
resource "google_service_account" "nats" {
  account_id   = "${var.prefix}-nats"
  display_name = "mesh NATS servers"
  description  = "Runs the three NATS servers: reads mesh-nats-config (and mesh-nats-tls), writes logs and metrics."
}

# The deployer: the middle of the cloud grants' chain. The runtime
# impersonates it; each customer lets it impersonate their own service
# account (docs/deploy.md, "The customer's side of a grant"). It holds no
# role in this project.
resource "google_service_account" "deployer" {
  account_id   = "${var.prefix}-deployer"
  display_name = "mesh deployer (cloud grants)"
  description  = "Impersonated by the mesh runtime; customers grant it roles/iam.serviceAccountTokenCreator on their own service account."
}

resource "google_service_account_iam_member" "deployer_token_creator" {
  service_account_id = google_service_account.deployer.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = "serviceAccount:${google_service_account.runtime.email}"
}

# The control-plane store. Firestore has no finer grant than the database.
resource "google_project_iam_member" "runtime_firestore" {
  project = var.project
  role    = "roles/datastore.user"
  member  = "serviceAccount:${google_service_account.runtime.email}"
}

# The role Cloud Run functions documents for a custom build account: read
# the source, write the image and the build's logs.
resource "google_project_iam_member" "builder" {
  project = var.project
  role    = "roles/cloudbuild.builds.builder"
  member  = "serviceAccount:${google_service_account.builder.email}"
}

resource "google_project_iam_member" "nats" {
  for_each = toset(["roles/logging.logWriter", "roles/monitoring.metricWriter"])
  project  = var.project
  role     = each.value
  member   = "serviceAccount:${google_service_account.nats.email}"
}
