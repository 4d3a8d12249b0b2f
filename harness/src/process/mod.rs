//! Running a program under the driver interposer and reading back what it
//! recorded: [`run`] starts it and collects its logs, [`report`] makes a
//! process's log into its peak ledgers, as text and HTML; [`driver_search`]
//! says where the loader would find the driver.

pub mod driver_search;
pub mod report;
pub mod run;
