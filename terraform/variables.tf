variable "project" {
  description = "The Google Cloud project the mesh runs in (its id, not its number)."
  type        = string
}

variable "region" {
  description = "The region of the functions, workers, NATS servers, scheduler jobs and source bucket."
  type        = string
  default     = "us-central1"
}

variable "prefix" {
  description = "Prefix of every resource name, so that resources of the mesh are easy to tell apart. Secret names do not carry it: one mesh per project."
  type        = string
  default     = "mesh"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,10}[a-z0-9]$", var.prefix))
    error_message = "The prefix is 2-12 lower-case letters, digits or hyphens, starting with a letter (service account ids must stay under 30 characters)."
  }
}

variable "labels" {
  description = "Labels added to every resource that takes them."
  type        = map(string)
  default     = {}
}

variable "domain" {
  description = "The one public host of the control plane, the registrar and the console, e.g. mesh.example.org. Point its DNS A record at the output http_ip; the managed certificate is issued once it resolves."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$", var.domain))
    error_message = "The domain is a lower-case host name such as mesh.example.org (no scheme, no path)."
  }
}

variable "nats_domain" {
  description = "The host agents dial for the bus (TCP 4222, WebSocket 4443). Empty means nats.<domain>. Point its DNS A record at the output nats_ip; it must match the certificate in the mesh-nats-tls secret."
  type        = string
  default     = ""
}

variable "mesh_name" {
  description = "The mesh's name in capabilities and credentials. Empty means the project id."
  type        = string
  default     = ""
}

variable "firestore_location" {
  description = "Location of the Firestore database (a region or a multi-region such as nam5). Empty means the region. It cannot be changed once the database exists."
  type        = string
  default     = ""
}

variable "function_source_zip" {
  description = "Path of the zip of the module's source that every Cloud Function is built from (Cloud Build makes it; docs/deploy.md)."
  type        = string
  default     = "function-source.zip"
}

variable "function_runtime" {
  description = "The Cloud Functions runtime of every route's function."
  type        = string
  default     = "go126"
}

variable "function_cpu" {
  description = "vCPUs of one function instance (a concurrency above 1 needs at least 1)."
  type        = string
  default     = "1"
}

variable "function_memory" {
  description = "Memory of one function instance."
  type        = string
  default     = "512Mi"
}

variable "function_concurrency" {
  description = "Requests one function instance serves at once. The dependencies (Firestore, NATS) are built once per instance, so a higher number means fewer cold starts."
  type        = number
  default     = 80
}

variable "function_max_instances" {
  description = "Upper bound of instances per function."
  type        = number
  default     = 20
}

variable "function_extra_env" {
  description = "More environment for every function, e.g. MESH_LIMIT_* knobs (docs/security.md) or MESH_RATE_LIMIT_PER_MINUTE. Never put a secret here: it would land in the Terraform state."
  type        = map(string)
  default     = {}
}

variable "timestamp_authorities" {
  description = "The public RFC 3161 timestamp authorities that stamp the daily audit anchors (docs/audit.md), two or more: each a name, its URL and the PEM file of the root its tokens must chain to (a path relative to this module, or absolute). The defaults are DigiCert's and GlobalSign's public services, with their roots as the Mozilla CA bundle ships them; check them against the authorities' own publications before relying on them."
  type = list(object({
    name          = string
    url           = string
    root_pem_file = string
  }))
  default = [
    { name = "digicert", url = "http://timestamp.digicert.com", root_pem_file = "timestamp-authorities/digicert-trusted-root-g4.pem" },
    { name = "globalsign", url = "http://timestamp.globalsign.com/tsa/r6advanced1", root_pem_file = "timestamp-authorities/globalsign-root-r6.pem" },
  ]

  validation {
    condition     = length(var.timestamp_authorities) >= 2
    error_message = "The anchors need at least two timestamp authorities: one that lies or disappears must not be the whole proof."
  }
}

variable "trusted_proxy_hops" {
  description = "How many X-Forwarded-For entries, counted from the right, were added by Google's front ends (MESH_TRUSTED_PROXY_HOPS). The global external Application Load Balancer appends the client address and its own, so the client is the second from the right."
  type        = number
  default     = 2
}

variable "smtp_addr" {
  description = "host:port of the SMTP relay that sends sign-in codes and agent keys."
  type        = string

  validation {
    condition     = can(regex("^[^:]+:[0-9]+$", var.smtp_addr))
    error_message = "smtp_addr is host:port, e.g. smtp.example.org:587."
  }
}

variable "smtp_from" {
  description = "Sender of the mesh's mail, e.g. \"Mesh <no-reply@example.org>\"."
  type        = string
}

variable "smtp_username" {
  description = "SMTP user name; empty for a relay that does not authenticate."
  type        = string
  default     = ""
}

variable "smtp_tls" {
  description = "How the connection to the relay is protected: require (STARTTLS, the default), opportunistic, implicit or none."
  type        = string
  default     = "require"

  validation {
    condition     = contains(["require", "opportunistic", "implicit", "none"], var.smtp_tls)
    error_message = "smtp_tls is one of require, opportunistic, implicit, none."
  }
}

variable "smtp_password_secret" {
  description = "Whether the relay needs a password. If true, Terraform makes the secret container mesh-smtp-password and every function reads SMTP_PASSWORD from it; add its value with gcloud secrets versions add (never here)."
  type        = bool
  default     = false
}

variable "image_tag" {
  description = "Tag of the worker images in the Artifact Registry repository (Cloud Build pushes <name>-worker:<tag>)."
  type        = string
}

variable "worker_cpu" {
  description = "vCPUs of one worker instance. CPU stays allocated (workers take their work from the bus, not from requests)."
  type        = string
  default     = "1"
}

variable "worker_memory" {
  description = "Memory of one worker instance."
  type        = string
  default     = "512Mi"
}

variable "subnet_cidr" {
  description = "Range of the mesh's subnet, where the NATS servers live (they take the addresses .10 to .12)."
  type        = string
  default     = "10.10.0.0/24"
}

variable "connector_cidr" {
  description = "A free /28 for the Serverless VPC Access connector that functions and workers reach NATS through."
  type        = string
  default     = "10.8.0.0/28"
}

variable "nats_image" {
  description = "The NATS server image the three servers run (the official image, same minor version as the embedded server: DEPENDENCIES.md)."
  type        = string
  default     = "nats:2.15.2"
}

variable "nats_machine_type" {
  description = "Machine type of each of the three NATS servers."
  type        = string
  default     = "e2-small"
}

variable "nats_disk_size_gb" {
  description = "Size of each NATS server's persistent disk (JetStream store and account JWTs)."
  type        = number
  default     = 20
}

variable "nats_jetstream_max_file" {
  description = "JetStream file storage each server may use; keep it below the disk size."
  type        = string
  default     = "15G"
}

variable "nats_tls" {
  description = "Whether the NATS servers serve TLS to agents (tls:// and wss://) with the certificate in the mesh-nats-tls secret. Turn off only to try a mesh out: agents then speak plain nats:// and ws://."
  type        = bool
  default     = true
}
