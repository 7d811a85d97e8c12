locals {
  labels      = merge({ mesh = var.prefix }, var.labels)
  mesh_name   = var.mesh_name != "" ? var.mesh_name : var.project
  control_url = "https://${var.domain}"
  nats_domain = var.nats_domain != "" ? var.nats_domain : "nats.${var.domain}"

  # Agents dial the bus by name through the network load balancer (TLS
  # unless var.nats_tls is off); workers dial the servers' private
  # addresses through the VPC connector.
  nats_public_urls   = "${var.nats_tls ? "tls" : "nats"}://${local.nats_domain}:4222"
  ws_public_urls     = "${var.nats_tls ? "wss" : "ws"}://${local.nats_domain}:4443"
  nats_internal_urls = join(",", [for a in google_compute_address.nats_internal : "nats://${a.address}:4222"])

  worker_image_prefix = "${var.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.mesh.repository_id}"

  # The environment every route's function reads once, in its lazy init
  # (functions/cloud FromEnv). The keys are not here: each instance reads
  # its seeds from Secret Manager at cold start (MESH_SECRETS_PROJECT).
  function_env = merge(var.function_extra_env, {
    GOOGLE_CLOUD_PROJECT    = var.project
    MESH_SECRETS_PROJECT    = var.project
    MESH_NAME               = local.mesh_name
    MESH_CONTROL_URL        = local.control_url
    MESH_CONSOLE_URL        = "${local.control_url}/console/"
    MESH_REGISTRAR_URL      = local.control_url
    MESH_NATS_URLS          = local.nats_public_urls
    MESH_NATS_INTERNAL_URLS = local.nats_internal_urls
    MESH_WS_URLS            = local.ws_public_urls
    MESH_TRUSTED_PROXY_HOPS = tostring(var.trusted_proxy_hops)
    MESH_DEPLOYER_SA        = google_service_account.deployer.email
    SMTP_ADDR               = var.smtp_addr
    SMTP_FROM               = var.smtp_from
    SMTP_USERNAME           = var.smtp_username
    SMTP_TLS                = var.smtp_tls
    # The audit anchors' authorities with their roots (functions/cloud
    # reads the JSON: audit.ParseAuthorities).
    MESH_TIMESTAMP_AUTHORITIES = jsonencode([for a in var.timestamp_authorities : {
      name     = a.name
      url      = a.url
      root_pem = file(startswith(a.root_pem_file, "/") ? a.root_pem_file : "${path.module}/${a.root_pem_file}")
    }])
  })

  # Environment variables of every function whose value comes from a
  # secret (name => secret id), mounted by Cloud Functions at start.
  function_secret_env = var.smtp_password_secret ? { SMTP_PASSWORD = google_secret_manager_secret.mesh["mesh-smtp-password"].secret_id } : {}

  apis = [
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "firestore.googleapis.com",
    "iam.googleapis.com",
    # The cloud grants' impersonation chain (GenerateAccessToken).
    "iamcredentials.googleapis.com",
    "logging.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
    "vpcaccess.googleapis.com",
  ]
}

resource "google_project_service" "enabled" {
  for_each = toset(local.apis)
  service  = each.value
  # Turning an API off on destroy would break anything else in the project.
  disable_on_destroy = false
}
