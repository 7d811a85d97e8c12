# Secret Manager holds every key of the mesh. Terraform makes only the
# containers and who may read them: the values are added by
# `meshd cloud init --project P` (and by hand for mesh-nats-tls and
# mesh-smtp-password), never here, because a value in Terraform would be
# written to its state.

locals {
  # The seeds of the trust chain, the registrar's card key, the services
  # key and the audit export key: what every route's function reads at
  # cold start.
  seed_secrets = [
    "mesh-operator-seed",
    "mesh-system-account-seed",
    "mesh-account-seed",
    "mesh-account-signing-seed",
    "mesh-registrar-seed",
    "mesh-services-seed",
    "mesh-export-seed",
  ]

  # mesh-nats-config is the NATS servers' configuration fragment (operator
  # JWT, system account, full resolver and its preload); each worker's
  # NATS credential is mesh-worker-<name>-creds.
  secrets = toset(concat(
    local.seed_secrets,
    ["mesh-nats-config"],
    [for w in local.worker_names : "mesh-worker-${w}-creds"],
    var.nats_tls ? ["mesh-nats-tls"] : [],
    var.smtp_password_secret ? ["mesh-smtp-password"] : [],
  ))
}

resource "google_secret_manager_secret" "mesh" {
  for_each  = local.secrets
  secret_id = each.value
  labels    = local.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.enabled]
}

# The runtime reads the seven seeds, and the SMTP password when there is one.
resource "google_secret_manager_secret_iam_member" "runtime" {
  for_each  = toset(concat(local.seed_secrets, var.smtp_password_secret ? ["mesh-smtp-password"] : []))
  secret_id = google_secret_manager_secret.mesh[each.value].id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.runtime.email}"
}

# The NATS servers read their configuration fragment and their certificate.
resource "google_secret_manager_secret_iam_member" "nats" {
  for_each  = toset(concat(["mesh-nats-config"], var.nats_tls ? ["mesh-nats-tls"] : []))
  secret_id = google_secret_manager_secret.mesh[each.value].id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.nats.email}"
}
