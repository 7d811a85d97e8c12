# The bus: three NATS servers with JetStream, one per zone, in operator
# mode with the directory ("full") resolver, so that revocations pushed on
# $SYS.REQ.CLAIMS.UPDATE take effect at once, as on one machine (DESIGN
# §4). Each is a Container-Optimized OS VM running the official image, with
# its own persistent disk and a fixed private address; its startup script
# (nats-startup.sh) fetches mesh-nats-config from Secret Manager and writes
# the cluster's routes. docs/deploy.md explains why VMs rather than GKE.

data "google_compute_zones" "available" {
  region = var.region
  status = "UP"
}

locals {
  nats_zones  = slice(sort(data.google_compute_zones.available.names), 0, 3)
  nats_routes = join(",", [for a in google_compute_address.nats_internal : "nats-route://${a.address}:6222"])
}

resource "google_compute_address" "nats_internal" {
  count        = 3
  name         = "${var.prefix}-nats-${count.index}"
  region       = var.region
  subnetwork   = google_compute_subnetwork.mesh.id
  address_type = "INTERNAL"
  address      = cidrhost(var.subnet_cidr, 10 + count.index)
}

# JetStream's store and the resolver's account JWTs. A disk outlives its VM:
# replacing a server keeps its data.
resource "google_compute_disk" "nats" {
  count  = 3
  name   = "${var.prefix}-nats-${count.index}-data"
  zone   = local.nats_zones[count.index]
  type   = "pd-balanced"
  size   = var.nats_disk_size_gb
  labels = local.labels
}

resource "google_compute_instance" "nats" {
  count                     = 3
  name                      = "${var.prefix}-nats-${count.index}"
  zone                      = local.nats_zones[count.index]
  machine_type              = var.nats_machine_type
  tags                      = [local.nats_tag]
  labels                    = local.labels
  allow_stopping_for_update = true

  boot_disk {
    initialize_params {
      image = "cos-cloud/cos-stable"
      size  = 10
    }
  }

  attached_disk {
    source      = google_compute_disk.nats[count.index].id
    device_name = "nats-data"
  }

  network_interface {
    subnetwork = google_compute_subnetwork.mesh.id
    network_ip = google_compute_address.nats_internal[count.index].address
  }

  service_account {
    email  = google_service_account.nats.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  scheduling {
    automatic_restart   = true
    on_host_maintenance = "MIGRATE"
  }

  metadata = {
    startup-script         = file("${path.module}/nats-startup.sh")
    shutdown-script        = "docker kill --signal=SIGUSR2 nats && sleep 40"
    google-logging-enabled = "true"
    enable-oslogin         = "TRUE"
    block-project-ssh-keys = "true"
    nats-server-name       = "${var.prefix}-nats-${count.index}"
    nats-cluster-name      = var.prefix
    nats-routes            = local.nats_routes
    nats-image             = var.nats_image
    nats-tls               = var.nats_tls ? "true" : "false"
    nats-max-file          = var.nats_jetstream_max_file
  }

  depends_on = [
    google_secret_manager_secret_iam_member.nats,
    google_project_iam_member.nats,
    google_compute_router_nat.mesh,
  ]
}

# The external passthrough network load balancer agents dial: TCP 4222
# (NATS) and 4443 (WebSocket), spread over the three servers, each
# answering its monitoring port's /healthz.
resource "google_compute_instance_group" "nats" {
  count     = 3
  name      = "${var.prefix}-nats-${count.index}"
  zone      = local.nats_zones[count.index]
  instances = [google_compute_instance.nats[count.index].self_link]
}

resource "google_compute_region_health_check" "nats" {
  name               = "${var.prefix}-nats"
  region             = var.region
  check_interval_sec = 10
  timeout_sec        = 5

  http_health_check {
    port         = 8222
    request_path = "/healthz"
  }
}

resource "google_compute_region_backend_service" "nats" {
  name                  = "${var.prefix}-nats"
  region                = var.region
  load_balancing_scheme = "EXTERNAL"
  protocol              = "TCP"
  health_checks         = [google_compute_region_health_check.nats.id]

  dynamic "backend" {
    for_each = google_compute_instance_group.nats
    content {
      group          = backend.value.id
      balancing_mode = "CONNECTION"
    }
  }
}

resource "google_compute_address" "nats_public" {
  name   = "${var.prefix}-nats-public"
  region = var.region

  depends_on = [google_project_service.enabled]
}

resource "google_compute_forwarding_rule" "nats" {
  name                  = "${var.prefix}-nats"
  region                = var.region
  load_balancing_scheme = "EXTERNAL"
  ip_address            = google_compute_address.nats_public.address
  ip_protocol           = "TCP"
  ports                 = ["4222", "4443"]
  backend_service       = google_compute_region_backend_service.nats.id
}
