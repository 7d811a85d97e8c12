# One VPC: the NATS servers live on its subnet with private addresses only;
# functions and workers reach them through the Serverless VPC Access
# connector (the Google provider 6.x has no Direct VPC egress for Cloud
# Functions; docs/deploy.md).

resource "google_compute_network" "mesh" {
  name                    = var.prefix
  auto_create_subnetworks = false

  depends_on = [google_project_service.enabled]
}

resource "google_compute_subnetwork" "mesh" {
  name          = var.prefix
  region        = var.region
  network       = google_compute_network.mesh.id
  ip_cidr_range = var.subnet_cidr
  # The NATS servers read Secret Manager without external addresses.
  private_ip_google_access = true
}

resource "google_vpc_access_connector" "mesh" {
  name          = "${var.prefix}-vpc"
  region        = var.region
  network       = google_compute_network.mesh.name
  ip_cidr_range = var.connector_cidr
  machine_type  = "e2-micro"
  min_instances = 2
  max_instances = 3

  depends_on = [google_project_service.enabled]
}

# Outbound internet for the NATS servers (they pull the NATS image from
# Docker Hub) without giving them external addresses.
resource "google_compute_router" "mesh" {
  name    = var.prefix
  region  = var.region
  network = google_compute_network.mesh.id
}

resource "google_compute_router_nat" "mesh" {
  name                               = var.prefix
  router                             = google_compute_router.mesh.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "LIST_OF_SUBNETWORKS"

  subnetwork {
    name                    = google_compute_subnetwork.mesh.id
    source_ip_ranges_to_nat = ["ALL_IP_RANGES"]
  }

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

locals {
  nats_tag = "${var.prefix}-nats"
}

# Agents reach the bus through the passthrough network load balancer,
# which keeps their own source addresses; workers and functions reach it
# from the connector's range. Both are clients of the same two ports.
resource "google_compute_firewall" "nats_clients" {
  name          = "${var.prefix}-nats-clients"
  network       = google_compute_network.mesh.id
  direction     = "INGRESS"
  source_ranges = ["0.0.0.0/0"]
  target_tags   = [local.nats_tag]

  allow {
    protocol = "tcp"
    ports    = ["4222", "4443"]
  }
}

# The cluster's routes: only between the three servers.
resource "google_compute_firewall" "nats_cluster" {
  name        = "${var.prefix}-nats-cluster"
  network     = google_compute_network.mesh.id
  direction   = "INGRESS"
  source_tags = [local.nats_tag]
  target_tags = [local.nats_tag]

  allow {
    protocol = "tcp"
    ports    = ["6222"]
  }
}

# The monitoring port answers the load balancer's health checks only.
resource "google_compute_firewall" "nats_health" {
  name          = "${var.prefix}-nats-health"
  network       = google_compute_network.mesh.id
  direction     = "INGRESS"
  source_ranges = ["35.191.0.0/16", "130.211.0.0/22", "209.85.152.0/22", "209.85.204.0/22"]
  target_tags   = [local.nats_tag]

  allow {
    protocol = "tcp"
    ports    = ["8222"]
  }
}

# SSH to a server only through Identity-Aware Proxy (gcloud compute ssh
# --tunnel-through-iap), for an operator holding the IAP and OS Login roles.
resource "google_compute_firewall" "nats_iap_ssh" {
  name          = "${var.prefix}-nats-iap-ssh"
  network       = google_compute_network.mesh.id
  direction     = "INGRESS"
  source_ranges = ["35.235.240.0/20"]
  target_tags   = [local.nats_tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}
