// Package policy says who may see and do what: the actor behind every
// request and action (who, their roles and scopes, how they signed in, via
// what, and the request id that ties the audit row, the log lines and the
// trace of one action together), and the policy file that maps users and
// groups to roles. A role grants actions on projections and scope keys
// (exact values or * patterns); every read and action of the console asks
// it, and the SQL of every list, count and action is held to the same
// grants (Allowed), so that a filter can narrow what an operator sees but
// never widen it.
//
// Without a policy file the console keeps its two kinds of user: operators
// may do everything everywhere, read-only users may view everything
// (Default).
package policy
