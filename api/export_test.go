package api

// Names of the API that its external tests (package api_test) read.
const MaxBodyBytes = maxBodyBytes

var ServeDashboard = serveDashboard
