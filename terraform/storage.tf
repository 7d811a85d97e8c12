# The control-plane store (DESIGN §6): accounts, keys, tokens, handles.
resource "google_firestore_database" "mesh" {
  name                    = "(default)"
  location_id             = var.firestore_location != "" ? var.firestore_location : var.region
  type                    = "FIRESTORE_NATIVE"
  delete_protection_state = "DELETE_PROTECTION_ENABLED"
  # terraform destroy leaves the database (and every account in it) alone.
  deletion_policy = "ABANDON"

  depends_on = [google_project_service.enabled]
}

# Worker images (pushed by Cloud Build) and the images Cloud Functions
# builds from the source zip.
resource "google_artifact_registry_repository" "mesh" {
  location      = var.region
  repository_id = var.prefix
  format        = "DOCKER"
  description   = "Images of the mesh: one per bus worker, and the built route functions."
  labels        = local.labels

  depends_on = [google_project_service.enabled]
}

# The one source zip every route's function is built from, each with its
# own entry point. The object's name carries the zip's digest, so new
# source redeploys every function and unchanged source none.
resource "google_storage_bucket" "source" {
  name                        = "${var.project}-${var.prefix}-source"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  labels                      = local.labels

  depends_on = [google_project_service.enabled]
}

resource "google_storage_bucket_object" "source" {
  name   = "function-source-${filemd5(var.function_source_zip)}.zip"
  bucket = google_storage_bucket.source.name
  source = var.function_source_zip
}
