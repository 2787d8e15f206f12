//! [`ConfigError`]: a configuration problem, naming the field, whether it
//! came from a flag, a variable or a policy file.

/// A configuration problem, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {description}")]
pub struct ConfigError {
    /// Path of the offending setting.
    pub field: String,
    /// What is wrong.
    pub description: String,
}

impl ConfigError {
    /// An error in `field`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}
