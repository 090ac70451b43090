// `sqlx::migrate!` embeds the migration files; rebuild when they change.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
