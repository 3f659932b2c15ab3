// Package classify turns every failure a projection can meet into a class
// and a reason. The class decides what the consume loop does with the row:
// a transient error goes back to pending with backoff, a deterministic one
// fails at once. The reason is what operators see in error_reason, in metric
// labels and in the runbook.
//
// Three kinds of input are classified:
//
//   - whole-request errors from the search client (Classify): olivere's
//     *elastic.Error carrying the engine's status and error type, transport
//     errors (timeouts, refused or reset connections) and anything else;
//   - errors from Postgres, for handlers that write there (Classify): the
//     SQLSTATE of a *pgconn.PgError, and pgconn's connect errors and timeouts;
//   - per-item results of a bulk response (FromBulkItem);
//   - errors a handler raises itself, such as an invalid payload (New).
//
// An *Error already in an error chain passes through Classify unchanged, so a
// handler can decide the reason and the loop still calls Classify on every
// result.
//
// The tests feed the classifier the responses captured from every tested
// engine (testdata/<engine>/, e.g. testdata/opensearch-2/) and require the
// same class and reason from each engine's version of a response, whatever
// the engine names its error. `make capture ENGINE=…` regenerates an
// engine's files; on every test run the live engine's answers are checked
// against them.
package classify
