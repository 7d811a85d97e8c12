// Package mesh is the root of the source tree Cloud Functions deploys. The
// Go buildpack builds only the package at the root of the uploaded source,
// so this file blank-imports every function group; each group's init
// registers its routes with the Functions Framework, and the deployment
// picks one by its entry point name (DESIGN §3).
package mesh

import (
	_ "agentmesh.dev/mesh/functions/accounts"
	_ "agentmesh.dev/mesh/functions/console"
	_ "agentmesh.dev/mesh/functions/credentials"
	_ "agentmesh.dev/mesh/functions/guest"
	_ "agentmesh.dev/mesh/functions/health"
	_ "agentmesh.dev/mesh/functions/registrar"
)
