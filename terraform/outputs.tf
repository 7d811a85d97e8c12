output "control_url" {
  description = "Base URL of the control plane and the registrar (MESH_CONTROL_URL); adapters use it as --control-url."
  value       = local.control_url
}

output "console_url" {
  description = "The web console."
  value       = "${local.control_url}/console/"
}

output "http_ip" {
  description = "Address of the load balancer: point var.domain's DNS A record here."
  value       = google_compute_global_address.http.address
}

output "nats_ip" {
  description = "Address of the bus's network load balancer: point the NATS host's DNS A record here."
  value       = google_compute_address.nats_public.address
}

output "nats_urls" {
  description = "The bus as agents dial it (TCP and WebSocket), handed out in every credential."
  value       = [local.nats_public_urls, local.ws_public_urls]
}

output "nats_internal_urls" {
  description = "The bus as workers dial it, on the servers' private addresses."
  value       = local.nats_internal_urls
}

output "deployer_email" {
  description = "The deployer service account of the cloud grants' chain: customers grant it roles/iam.serviceAccountTokenCreator on their own service account."
  value       = google_service_account.deployer.email
}

output "runtime_email" {
  description = "The service account every route's function runs as."
  value       = google_service_account.runtime.email
}

output "image_repository" {
  description = "Where Cloud Build pushes the worker images (<name>-worker:<tag>)."
  value       = local.worker_image_prefix
}
