"""A row's media: the pixel budget and images (`vision`), video and its budget (`video`), each family's box frame (`boxes`)."""
