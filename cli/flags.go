package cli

import "github.com/wlproj/wlproj/projection"

// dbFlags is the database every command but run's engine side talks to.
type dbFlags struct {
	// Required, but checked by Validate rather than kong's required:
	// kong's "missing flags: --database-url" names no variable, and takes
	// an empty DATABASE_URL for one given (libpq's defaults then connect).
	DatabaseURL string `help:"Postgres connection URL (required)." env:"DATABASE_URL" field:"DatabaseURL"`
}

// dbCommand is a command with a database: its errors are scrubbed of the
// URL's credentials.
type dbCommand interface{ databaseURL() string }

func (f dbFlags) databaseURL() string { return f.DatabaseURL }

// The flags' defaults and ranges are ${…} variables filled from the
// packages' constants (see flagVars): each default has one home. The `field`
// tag names the package Config field a flag sets (see names.go).
type elasticFlags struct {
	ElasticURL      string  `help:"Elasticsearch base URL, or several nodes' URLs separated by commas (requests are spread over them)." env:"ELASTIC_URL" default:"http://127.0.0.1:9200" field:"URL"`
	ElasticUsername string  `help:"Elasticsearch basic-auth user." env:"ELASTIC_USERNAME" field:"Username"`
	ElasticPassword string  `help:"Elasticsearch basic-auth password." env:"ELASTIC_PASSWORD" field:"Password"`
	ElasticAPIKey   string  `name:"elastic-api-key" help:"Elasticsearch API key, id:key or its base64 form; instead of basic auth." env:"ELASTIC_API_KEY" field:"APIKey"`
	ElasticCAFile   string  `name:"elastic-ca-file" help:"PEM file of the CA that signed the engine's TLS certificate." env:"ELASTIC_CA_FILE" type:"existingfile"`
	ElasticTimeout  float64 `help:"Timeout of one request to the engine, in seconds [${elastic_timeout_range}]." env:"ELASTIC_TIMEOUT_SECONDS" default:"${elastic_timeout}" field:"Timeout"`
}

// options are the engine client's settings.
func (f elasticFlags) options() projection.ElasticOptions {
	return projection.ElasticOptions{URL: f.ElasticURL, Username: f.ElasticUsername, Password: f.ElasticPassword,
		APIKey: f.ElasticAPIKey, CAFile: f.ElasticCAFile, Timeout: seconds(f.ElasticTimeout)}
}
