# The one public host: a global external Application Load Balancer. Its
# URL map (google_compute_url_map.mesh, with a route rule per row, a
# serverless NEG and a backend service per function) is generated into
# routes.tf.json; this file is its front: address, certificate, proxies,
# forwarding rules, and the plain-HTTP redirect.

resource "google_compute_global_address" "http" {
  name = "${var.prefix}-http"

  depends_on = [google_project_service.enabled]
}

# Issued once var.domain resolves to the address above (minutes to hours).
# The name follows the domain so a new domain gets a new certificate
# before the old one goes.
resource "google_compute_managed_ssl_certificate" "mesh" {
  name = "${var.prefix}-${substr(sha256(var.domain), 0, 8)}"

  managed {
    domains = [var.domain]
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_ssl_policy" "mesh" {
  name            = "${var.prefix}-tls"
  profile         = "MODERN"
  min_tls_version = "TLS_1_2"
}

resource "google_compute_target_https_proxy" "mesh" {
  name             = "${var.prefix}-https"
  url_map          = google_compute_url_map.mesh.id
  ssl_certificates = [google_compute_managed_ssl_certificate.mesh.id]
  ssl_policy       = google_compute_ssl_policy.mesh.id
}

resource "google_compute_global_forwarding_rule" "https" {
  name                  = "${var.prefix}-https"
  ip_address            = google_compute_global_address.http.id
  ip_protocol           = "TCP"
  port_range            = "443"
  target                = google_compute_target_https_proxy.mesh.id
  load_balancing_scheme = "EXTERNAL_MANAGED"
}

# Port 80 only redirects to https.
resource "google_compute_url_map" "redirect" {
  name        = "${var.prefix}-http-redirect"
  description = "Sends every plain-HTTP request to https."

  default_url_redirect {
    https_redirect         = true
    strip_query            = false
    redirect_response_code = "MOVED_PERMANENTLY_DEFAULT"
  }
}

resource "google_compute_target_http_proxy" "redirect" {
  name    = "${var.prefix}-http-redirect"
  url_map = google_compute_url_map.redirect.id
}

resource "google_compute_global_forwarding_rule" "http" {
  name                  = "${var.prefix}-http-redirect"
  ip_address            = google_compute_global_address.http.id
  ip_protocol           = "TCP"
  port_range            = "80"
  target                = google_compute_target_http_proxy.redirect.id
  load_balancing_scheme = "EXTERNAL_MANAGED"
}
