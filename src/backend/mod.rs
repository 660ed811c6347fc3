//! The glue between PostgreSQL and every SQL concept, in one place:
//! - `error`:    one way to raise an ERROR (SQLSTATE, message, hint) and the
//!   input checks shared by several concepts;
//! - `fmgr`:     the one macro for functions written against the function
//!   manager (`pg_claim_<name>` and its info record);
//! - `limits`:   fixed limits shared by the key layout and the settings;
//! - `settings`: the `pg_claim.*` parameters, `_PG_init`'s registrations and
//!   the dead-client check they switch on;
//! - `internal`: the extension's internal SECURITY DEFINER functions, found by
//!   exact signature and extension membership and called through fmgr by OID;
//! - `catalog`:  catalog look-ups every concept uses: quoting, qualified
//!   relation and type names, schemas, collations;
//! - `compat`:   the calls into PostgreSQL that differ between the major
//!   versions pg_claim builds for, one definition per version.

pub mod catalog;
pub mod compat;
pub mod error;
pub mod fmgr;
pub mod internal;
pub mod limits;
pub mod settings;
