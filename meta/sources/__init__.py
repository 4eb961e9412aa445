"""Where the meta-plugin reads pods and NetworkAttachmentDefinitions and reports back to."""
